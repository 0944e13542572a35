"""gated_rmsnorm in Triton: the T*H head rows of a prefill chunk, BLOCK_R rows a program.
Each row is normalized in fp32 (the mean of squares over K, plus eps, its rsqrt), times the
weight, times sigmoid(z), in the reference's order, and rounded once to out's dtype. It
replaces the eleven aten kernels of the eager norm (casts, pow, mean, rsqrt, products) and
the cast after it. Memory traffic per row: o and z read, the output written (3 * K * 2 bytes
in bf16), the weight from cache. A fixed tile, no autotune: a first call inside a prefill
would time configs.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.gated_rmsnorm.reference import check_inputs
from engined.ops.w4a16_gemv.triton import out_buffer

BLOCK_ROWS = 16


@triton.jit
def gated_rmsnorm_kernel(o_ptr, z_ptr, w_ptr, y_ptr, R, K, eps, BLOCK_R: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    mask = (rows < R)[:, None] & (cols < K)[None, :]
    at = rows.to(tl.int64)[:, None] * K + cols[None, :]
    o = tl.load(o_ptr + at, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + at, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    y = o * tl.rsqrt(tl.sum(o * o, axis=1) / K + eps)[:, None]
    y = y * w[None, :] * tl.sigmoid(z)
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    check_inputs(o, z, weight)
    if not (o.is_contiguous() and z.is_contiguous() and weight.is_contiguous()):
        raise registry.KernelError("gated_rmsnorm: o, z and weight must be contiguous")
    out = out_buffer(out, tuple(o.shape), o.device, "gated_rmsnorm", o.dtype)
    rows, k = o.shape[0] * o.shape[1], o.shape[2]
    block_k = triton.next_power_of_2(k)
    gated_rmsnorm_kernel[(triton.cdiv(rows, BLOCK_ROWS),)](
        o, z, weight, out, rows, k, eps, BLOCK_R=BLOCK_ROWS, BLOCK_K=block_k,
        num_warps=4 if BLOCK_ROWS * block_k >= 2048 else 1)
    return out
