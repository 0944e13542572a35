"""paged_mla_decode on the CPU, a row at a time: the row's blocks gathered up to its length
(rounded up to a block), then one [q_lat ; q_rope] x [ĉ ; kr] product, one length-masked
softmax and one product with the latents for every head.

Each row alone, because a row's result must not depend on its batch (ops/rowwise.py: a
speculative verify's rows equal lone steps bit for bit); gathering a group of rows up to the
longest changed the padded length and so the products' sums. The products are compute-bound
on the CPU, so rows alone cost little more than groups (and a gather larger than the cache
made a group of 8 long rows ~40% slower than rows alone). Masked keys still enter the
products (times zero), so the rows of a row's own blocks past its length must be finite: the
pool zeroes blocks when it hands them out.
"""
import torch

from engined.ops import registry
from engined.ops.paged_mla_decode.reference import check_inputs


@registry.register("paged_mla_decode", "cpu_rows", devices=("cpu",),
                   description="torch: each row's blocks gathered, one length-masked softmax")
def paged_mla_decode(q_lat, q_rope, pool, block_tables, lengths, scale: float,
                     out=None) -> torch.Tensor:
    check_inputs(q_lat, q_rope, pool, block_tables, lengths)
    b, h, r = q_lat.shape
    lengths = lengths.to(torch.int64)
    q = torch.cat((q_lat, q_rope), -1).float()                     # [B, H, R+P]
    o = torch.empty((b, h, r), dtype=torch.float32) if out is None else out
    for row in range(b):
        rows = slice(row, row + 1)
        _attend(q[rows], pool, block_tables[rows], lengths[rows], scale, o[rows])
    return o


def _attend(q, pool, tables, lengths, scale, out):
    # q: [G, H, R+P] -> out: [G, H, R], G rows over their own keys padded to the longest's
    # whole blocks (paged_mla_decode passes G = 1: each row alone, row-exact)
    g, r, block = q.shape[0], out.shape[2], pool.shape[1]
    num_blocks = -(-int(lengths.max()) // block)
    tables = tables[:, :num_blocks].to(torch.int64)               # [G, nb]
    used = torch.arange(num_blocks) * block < lengths[:, None]    # padding -> the row's first block
    seen = pool[torch.where(used, tables, tables[:, :1])].view(g, num_blocks * block, -1).float()
    scores = torch.bmm(q, seen.transpose(1, 2)).mul_(scale)       # [G, H, S]
    past = torch.arange(num_blocks * block) >= lengths[:, None]   # [G, S] keys past each row
    probs = torch.softmax(scores.masked_fill_(past[:, None, :], float("-inf")), dim=-1)
    out.copy_(torch.bmm(probs, seen)[..., :r])                    # [G, H, R]


registry.set_default("paged_mla_decode", "cpu", "cpu_rows")
