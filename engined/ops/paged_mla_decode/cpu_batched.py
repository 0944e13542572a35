"""paged_mla_decode on the CPU, batched: a group of rows' blocks gathered at once up to the
group's longest row, then one [q_lat ; q_rope] x [ĉ ; kr] product, one length-masked softmax
and one product with the latents for every row and head of the group.

Groups are sized so their gathered latents stay within GROUP_BYTES: the two products are
compute-bound on the CPU, and a gather larger than the cache made a batch of 8 long rows ~40%
slower than one row at a time (H = 32, R+P = 576, 2k keys: 4.7 MB per row). Short rows, where
per-row overhead dominates, go all in one group. Masked keys still enter the products (times
zero), so the rows of a row's own blocks past its length must be finite: the pool zeroes
blocks when it hands them out.
"""
import torch

from engined.ops import registry
from engined.ops.paged_mla_decode.reference import check_inputs

GROUP_BYTES = 8 * 2**20


@registry.register("paged_mla_decode", "cpu_batched", devices=("cpu",),
                   description="torch: gather groups of rows' blocks, one length-masked softmax each")
def paged_mla_decode(q_lat, q_rope, pool, block_tables, lengths, scale: float,
                     out=None) -> torch.Tensor:
    check_inputs(q_lat, q_rope, pool, block_tables, lengths)
    b, h, r = q_lat.shape
    lengths = lengths.to(torch.int64)
    longest = int(lengths.max())                                   # host sync: free on the CPU
    group = max(1, GROUP_BYTES // (longest * pool.shape[2] * 4))
    q = torch.cat((q_lat, q_rope), -1).float()                     # [B, H, R+P]
    o = torch.empty((b, h, r), dtype=torch.float32) if out is None else out
    for first in range(0, b, group):
        rows = slice(first, first + group)
        _attend(q[rows], pool, block_tables[rows], lengths[rows], scale, o[rows])
    return o


def _attend(q, pool, tables, lengths, scale, out):
    # q: [G, H, R+P] -> out: [G, H, R], G rows over their own keys, S = the longest's, padded
    g, r, block = q.shape[0], out.shape[2], pool.shape[1]
    num_blocks = -(-int(lengths.max()) // block)
    tables = tables[:, :num_blocks].to(torch.int64)               # [G, nb]
    used = torch.arange(num_blocks) * block < lengths[:, None]    # padding -> the row's first block
    seen = pool[torch.where(used, tables, tables[:, :1])].view(g, num_blocks * block, -1).float()
    scores = torch.bmm(q, seen.transpose(1, 2)).mul_(scale)       # [G, H, S]
    past = torch.arange(num_blocks * block) >= lengths[:, None]   # [G, S] keys past each row
    probs = torch.softmax(scores.masked_fill_(past[:, None, :], float("-inf")), dim=-1)
    out.copy_(torch.bmm(probs, seen)[..., :r])                    # [G, H, R]


registry.set_default("paged_mla_decode", "cpu", "cpu_batched")
