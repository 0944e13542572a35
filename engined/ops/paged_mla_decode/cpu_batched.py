"""paged_mla_decode on the CPU, batched: every row's blocks gathered at once up to the longest
row, one masked softmax for all rows and heads. The gather copies B * S_max latent rows
((R+P) * 4 bytes each in fp32), which on the CPU costs less than B rounds of small per-row ops;
a short row beside a long one pays for the long one's keys (masked), as padding does. Masked
keys still enter the products (times zero), so the rows of a row's own blocks past its length
must be finite: the pool zeroes blocks when it hands them out."""
import torch

from engined.ops import registry
from engined.ops.paged_mla_decode.reference import check_inputs


@registry.register("paged_mla_decode", "cpu_batched", devices=("cpu",),
                   description="torch: gather the rows' blocks, one length-masked softmax")
def paged_mla_decode(q_lat, q_rope, pool, block_tables, lengths, scale: float,
                     out=None) -> torch.Tensor:
    check_inputs(q_lat, q_rope, pool, block_tables, lengths)
    b, r, block = q_lat.shape[0], q_lat.shape[2], pool.shape[1]
    lengths = lengths.to(torch.int64)
    num_blocks = -(-int(lengths.max()) // block)                   # host sync: free on the CPU
    tables = block_tables[:, :num_blocks].to(torch.int64)          # [B, nb]
    used = torch.arange(num_blocks) * block < lengths[:, None]     # padding -> the row's first block
    seen = pool[torch.where(used, tables, tables[:, :1])].reshape(b, num_blocks * block, -1).float()  # [B, S, R+P]
    c, kr = seen[..., :r], seen[..., r:]
    # b row, h head, r latent dim, p rope dim, s key position
    scores = (torch.einsum("bhr,bsr->bhs", q_lat.float(), c)
              + torch.einsum("bhp,bsp->bhs", q_rope.float(), kr)) * scale
    past = torch.arange(num_blocks * block) >= lengths[:, None]    # [B, S] keys past each row
    probs = torch.softmax(scores.masked_fill(past[:, None, :], float("-inf")), dim=-1)
    o = torch.einsum("bhs,bsr->bhr", probs, c)
    return o if out is None else out.copy_(o)


registry.set_default("paged_mla_decode", "cpu", "cpu_batched")
