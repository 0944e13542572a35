"""w4a16_gemv in Triton: a real GEMV, one program per (row of x, BLOCK_N outputs).

Each program walks K (the contiguous axis of the packed weight) with a single-row
fp32 accumulator [BLOCK_N]; no tl.dot and no 16-row tile. Memory traffic per output
element: K/2 code bytes + 4*K/G bytes of fp16 scale and min, read once per row of x
(rows of one N tile run next to each other, so rows after the first hit L2); x is
4*K bytes shared by the whole row and stays in cache.

Written against basic tl ops only, so it runs on triton 3.6 (GPU image) and 3.9 (CI),
and under TRITON_INTERPRET=1 on the CPU.
"""
import torch
import triton
import triton.language as tl

from engined.ops import int4_format, registry


@triton.jit
def int4_row_dot(x_row, q_rows, s_rows, m_rows, offs_n, n_mask, K,
                 GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[i] = sum_k x_row[k] * (s*q + m)[offs_n[i], k]; *_rows point at weight row 0."""
    half_k = K // 2
    groups = K // GROUP
    offs_b = tl.arange(0, BLOCK_K // 2)  # byte j of the tile holds elements 2j, 2j+1
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b = k0 // 2 + offs_b
        b_mask = b < half_k
        mask = n_mask[:, None] & b_mask[None, :]
        q = tl.load(q_rows + offs_n[:, None] * half_k + b[None, :], mask=mask, other=0)
        g = offs_n[:, None] * groups + (2 * b[None, :]) // GROUP
        s = tl.load(s_rows + g, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(m_rows + g, mask=mask, other=0.0).to(tl.float32)
        x_even = tl.load(x_row + 2 * b, mask=b_mask, other=0.0)
        x_odd = tl.load(x_row + 2 * b + 1, mask=b_mask, other=0.0)
        w_even = (q & 0xF).to(tl.float32) * s + m
        w_odd = (q >> 4).to(tl.float32) * s + m
        acc += tl.sum(w_even * x_even[None, :] + w_odd * x_odd[None, :], axis=1)
    return acc


@triton.jit
def w4a16_gemv_kernel(x_ptr, q_ptr, s_ptr, m_ptr, y_ptr, N, K,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = int4_row_dot(x_ptr + row * K, q_ptr, s_ptr, m_ptr, offs_n, n_mask, K,
                       GROUP, BLOCK_N, BLOCK_K)
    tl.store(y_ptr + row * N + offs_n, acc, mask=n_mask)


def configs() -> list[dict]:
    """The launch configurations, narrowest first; `pick_config` chooses among them."""
    return [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w)
            for bn, bk, w in ((16, 256, 4), (32, 256, 4), (64, 256, 8))]


def pick_config(n: int, k: int, programs_per_row: int = 1) -> dict:
    """A fixed rule (no autotune sweep): enough N tiles to fill the GPU, long K tiles."""
    interpreted = triton_interpreted()
    for cfg in reversed(configs()) if interpreted else configs():
        if interpreted or triton.cdiv(n, cfg["BLOCK_N"]) * programs_per_row >= 256:
            return cfg
    return configs()[0]


def triton_interpreted() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_packed(w, what: str):
    """Constraints every Triton INT4 launcher shares, each with its message."""
    tensors = (w.qweight, w.scales, w.mins)
    if not all(t.is_contiguous() for t in tensors):
        raise registry.KernelError(f"{what}: qweight, scales and mins must be contiguous")
    if len({t.device for t in tensors}) != 1:
        raise registry.KernelError(f"{what}: qweight, scales and mins are on different devices")
    if w.qweight.device.type != "cuda" and not triton_interpreted():
        raise registry.KernelError(f"{what}: the triton variant needs CUDA tensors "
                                   f"(or TRITON_INTERPRET=1), got {w.qweight.device}")


def as_rows(x: torch.Tensor, k: int, device, what: str) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != k:
        raise registry.KernelError(f"{what}: x must be [M, {k}], got {list(x.shape)}")
    if x.device != device:
        raise registry.KernelError(f"{what}: x is on {x.device}, the weight on {device}")
    return x.to(torch.float32).contiguous()


def out_buffer(out, shape, device, what: str) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    if tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous() \
            or out.device != device:
        raise registry.KernelError(f"{what}: out must be a contiguous fp32 {list(shape)} on "
                                   f"{device}, got {out.dtype} {list(out.shape)} on {out.device}")
    return out


def w4a16_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    check_packed(w, "w4a16_gemv")
    n, k = w.shape
    x = as_rows(x, k, w.qweight.device, "w4a16_gemv")
    out = out_buffer(out, (x.shape[0], n), w.qweight.device, "w4a16_gemv")
    cfg = pick_config(n, k, x.shape[0])
    grid = (x.shape[0], triton.cdiv(n, cfg["BLOCK_N"]))
    w4a16_gemv_kernel[grid](x, w.qweight, w.scales, w.mins, out, n, k, GROUP=w.group_size, **cfg)
    return out

