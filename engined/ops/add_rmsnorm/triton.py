"""add_rmsnorm in Triton: one program per row of h; the row's sum is rounded to h's dtype and
stored back, then normalized in fp32, rounded to h's dtype and scaled by the weight, as the
reference rounds. Memory traffic per row: h and delta read, h and out written (4 * D * 2 bytes
in bf16), the weight from cache.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.add_rmsnorm.reference import check_inputs


@triton.jit
def add_rmsnorm_kernel(h_ptr, d_ptr, w_ptr, o_ptr, D, eps, HAS_DELTA: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    h = tl.load(h_ptr + row * D + offs, mask=mask, other=0.0)
    if HAS_DELTA:
        h = (h.to(tl.float32) + tl.load(d_ptr + row * D + offs, mask=mask, other=0.0).to(tl.float32)
             ).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * D + offs, h, mask=mask)
    hf = h.to(tl.float32)
    y = (hf * tl.rsqrt(tl.sum(hf * hf, axis=0) / D + eps)).to(h_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(o_ptr + row * D + offs, (y.to(tl.float32) * w.to(tl.float32)).to(o_ptr.dtype.element_ty),
             mask=mask)


def add_rmsnorm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
    check_inputs(h, delta, weight)
    if not h.is_contiguous() or (delta is not None and not delta.is_contiguous()):
        raise registry.KernelError("add_rmsnorm: h and delta must be contiguous")
    if out is None:
        out = torch.empty_like(h)
    elif out.shape != h.shape or out.dtype != h.dtype or not out.is_contiguous():
        raise registry.KernelError(f"add_rmsnorm: out must be a contiguous {h.dtype} {list(h.shape)}")
    b, d = h.shape
    block = triton.next_power_of_2(d)
    add_rmsnorm_kernel[(b,)](h, h if delta is None else delta, weight, out, d, eps,
                             HAS_DELTA=delta is not None, BLOCK_D=block,
                             num_warps=min(16, max(1, block // 256)))
    return out
