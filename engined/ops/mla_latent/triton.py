"""mla_latent in Triton: one program per decode row normalizes its latent (kv_a_layernorm),
finds its pool row through its block table and position, and stores [ĉ ; kr] there and in out.
One launch where MLA.decode_batch ran the norm's ~6 kernels, a cat, a gather and an index_copy;
no host sync, so a CUDA graph can hold it.

Memory traffic per row: kv's R+P act values and the norm's R weights read, the row written
twice (pool and out) in the pool's dtype: 3,456 B in bf16 at R = 512, P = 64.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.mla_latent.reference import check_inputs


@triton.jit
def mla_latent_kernel(kv_ptr, w_ptr, pool_ptr, tables_ptr, positions_ptr, o_ptr, eps, MB,
                      R: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr,
                      SCALE_IN_ACT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs_r, offs_p = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_P)
    r_mask, p_mask = offs_r < R, offs_p < P
    act = kv_ptr.dtype.element_ty
    kdt = pool_ptr.dtype.element_ty
    c = tl.load(kv_ptr + row * (R + P) + offs_r, mask=r_mask, other=0.0).to(tl.float32)
    kr = tl.load(kv_ptr + row * (R + P) + R + offs_p, mask=p_mask, other=0.0)
    w = tl.load(w_ptr + offs_r, mask=r_mask, other=0.0).to(tl.float32)
    # RMSNorm's rounding: normalized in fp32, cast to the act dtype, times the weight (a 16-bit
    # product is exact in fp32, so one rounding to the act dtype matches torch's)
    normed = (c * tl.rsqrt(tl.sum(c * c, axis=0) / R + eps)).to(act).to(tl.float32) * w
    if SCALE_IN_ACT:
        normed = normed.to(act)
    pos = tl.load(positions_ptr + row)
    blk = tl.load(tables_ptr + row * MB + pos // BLOCK).to(tl.int64)
    normed, kr = normed.to(kdt), kr.to(kdt)
    at = pool_ptr + (blk * BLOCK + pos % BLOCK) * (R + P)
    tl.store(at + offs_r, normed, mask=r_mask)
    tl.store(at + R + offs_p, kr, mask=p_mask)
    tl.store(o_ptr + row * (R + P) + offs_r, normed, mask=r_mask)
    tl.store(o_ptr + row * (R + P) + R + offs_p, kr, mask=p_mask)


def mla_latent(kv, norm_weight, eps: float, pool, block_tables, positions,
               out=None) -> torch.Tensor:
    check_inputs(kv, norm_weight, pool, block_tables, positions)
    b, width = kv.shape
    r = norm_weight.shape[0]
    if not pool.is_contiguous():
        raise registry.KernelError("mla_latent: the latent pool must be contiguous")
    if out is not None and (out.shape != (b, width) or out.dtype != pool.dtype
                            or not out.is_contiguous()):
        raise registry.KernelError(f"mla_latent: out must be a contiguous {pool.dtype} [{b}, {width}]")
    kv, norm_weight = kv.contiguous(), norm_weight.contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    positions = positions.to(torch.int64).contiguous()
    o = torch.empty((b, width), dtype=pool.dtype, device=kv.device) if out is None else out
    scale_in_act = torch.promote_types(kv.dtype, norm_weight.dtype) == kv.dtype
    mla_latent_kernel[(b,)](
        kv, norm_weight, pool, tables, positions, o, eps, tables.shape[1], R=r, P=width - r,
        BLOCK=pool.shape[1], SCALE_IN_ACT=scale_in_act, BLOCK_R=triton.next_power_of_2(r),
        BLOCK_P=triton.next_power_of_2(width - r))
    return o
