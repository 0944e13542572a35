"""Plain reference for mla_latent: the new latent row of each of B decode tokens, [ĉ ; kr] with
ĉ = kv_a_layernorm(kv[:, :R]) (reference §2.4, layers/mla.MLA._latent), written into the layer's
paged pool at the token's position (layers/mla.MLA.decode_batch, models/latent_pool.py).

| tensor       | shape              | dtype                                               |
|--------------|--------------------|-----------------------------------------------------|
| kv           | [B, R + P]         | the act dtype: kv_a_proj_with_mqa's output [c ; kr]  |
| norm_weight  | [R]                | kv_a_layernorm's weight (the act dtype when served) |
| pool         | [NB, BLOCK, R + P] | any float; updated in place                         |
| block_tables | [B, MB]            | int64; row b's blocks                               |
| positions    | [B]                | int64; row b's position, < MB * BLOCK               |
| out          | [B, R + P]         | pool's dtype: the rows written                      |

ĉ rounds as layers/rmsnorm.RMSNorm: normalized in fp32, cast to kv's dtype, then times the
weight (in the dtype the two promote to); the row is then cast to the pool's dtype, and lands at
pool[block_tables[b, positions[b] // BLOCK], positions[b] % BLOCK].
"""
import torch

from engined.ops import registry
from engined.ops.paged_mla_decode.reference import check_paged_rows


def check_inputs(kv, norm_weight, pool, block_tables, positions):
    if kv.dim() != 2 or norm_weight.dim() != 1 or not 0 < norm_weight.shape[0] < kv.shape[1]:
        raise ValueError(f"mla_latent: kv [B, R+P] and norm_weight [R] (0 < R < R+P) needed, got "
                         f"{list(kv.shape)} {list(norm_weight.shape)}")
    check_paged_rows("mla_latent", kv.shape[0], kv.shape[1], pool, block_tables, "positions",
                     positions)


@registry.register("mla_latent", registry.REFERENCE,
                   description="torch: RMSNorm the latent, index the pool rows, copy")
def mla_latent(kv, norm_weight, eps: float, pool, block_tables, positions,
               out=None) -> torch.Tensor:
    check_inputs(kv, norm_weight, pool, block_tables, positions)
    r, block = norm_weight.shape[0], pool.shape[1]
    c, kr = kv[:, :r], kv[:, r:]
    cf = c.float()
    normed = norm_weight * (cf * torch.rsqrt(cf.pow(2).mean(-1, keepdim=True) + eps)).to(kv.dtype)
    latent = torch.cat((normed.to(pool.dtype), kr.to(pool.dtype)), -1)     # [B, R+P]
    blocks = block_tables.gather(1, (positions // block)[:, None].to(torch.int64))[:, 0]
    pool[blocks, positions % block] = latent
    return latent if out is None else out.copy_(latent)
