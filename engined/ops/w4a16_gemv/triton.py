"""w4a16_gemv in Triton: a real GEMV, one program per (row of x, BLOCK_N outputs).

Each program walks K (the contiguous axis of the packed weight) with a single-row
fp32 accumulator [BLOCK_N]; no tl.dot and no 16-row tile. Memory traffic per output
element: K/2 code bytes + 4*K/G bytes of fp16 scale and min (2*K/G for a symmetric
weight, which has no mins), read once per row of x
(rows of one N tile run next to each other, so rows after the first hit L2); x is
4*K bytes shared by the whole row and stays in cache.

Written against basic tl ops only, so it runs on triton 3.6 (GPU image) and 3.9 (CI),
and under TRITON_INTERPRET=1 on the CPU.
"""
import os

import torch
import triton
import triton.language as tl

from engined.ops import int4_format, registry


@triton.jit
def int4_row_dot(x_row, q_rows, s_rows, m_rows, offs_n, n_mask, K,
                 GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 HAS_MINS: tl.constexpr):
    """acc[i] = sum_k x_row[k] * (s*q + m)[offs_n[i], k]; *_rows point at weight row 0.

    Per group g: s_g * dot(q_g, x_g) + m_g * sum(x_g), so the inner loop is one
    multiply-add per weight and scales/mins are loaded once per group. Without mins
    (HAS_MINS false: symmetric, w = s*(q - 8)) m_g is -8 s_g and m_rows is not read. A K tile is
    [BLOCK_N, BLOCK_K/GROUP groups, GROUP/2 bytes]; byte j of a group holds
    elements 2j (low nibble) and 2j+1 (high nibble)."""
    half_k = K // 2
    groups = K // GROUP
    offs_g = tl.arange(0, BLOCK_K // GROUP)  # [NG] groups of the tile
    offs_j = tl.arange(0, GROUP // 2)        # [G/2] bytes of a group
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        g = k0 // GROUP + offs_g
        g_mask = g < groups
        b = g[:, None] * (GROUP // 2) + offs_j[None, :]  # [NG, G/2] byte index in a row
        x_even = tl.load(x_row + 2 * b, mask=g_mask[:, None], other=0.0)
        x_odd = tl.load(x_row + 2 * b + 1, mask=g_mask[:, None], other=0.0)
        q_mask = n_mask[:, None, None] & g_mask[None, :, None]
        q = tl.load(q_rows + offs_n[:, None, None] * half_k + b[None, :, :], mask=q_mask, other=0)
        dot = tl.sum((q & 0xF).to(tl.float32) * x_even[None, :, :]
                     + (q >> 4).to(tl.float32) * x_odd[None, :, :], axis=2)  # [BLOCK_N, NG]
        x_sum = tl.sum(x_even + x_odd, axis=1)  # [NG]
        sm_mask = n_mask[:, None] & g_mask[None, :]
        sm = offs_n[:, None] * groups + g[None, :]
        s = tl.load(s_rows + sm, mask=sm_mask, other=0.0).to(tl.float32)
        if HAS_MINS:
            m = tl.load(m_rows + sm, mask=sm_mask, other=0.0).to(tl.float32)
        else:
            m = -8.0 * s
        acc += tl.sum(s * dot + m * x_sum[None, :], axis=1)
    return acc


@triton.jit
def w4a16_gemv_kernel(x_ptr, q_ptr, s_ptr, m_ptr, y_ptr, N, K,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      HAS_MINS: tl.constexpr):
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = int4_row_dot(x_ptr + row * K, q_ptr, s_ptr, m_ptr, offs_n, n_mask, K,
                       GROUP, BLOCK_N, BLOCK_K, HAS_MINS)
    tl.store(y_ptr + row * N + offs_n, acc, mask=n_mask)


def configs() -> list[dict]:
    """The launch configurations, narrowest first; `pick_config` chooses among them."""
    return [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w)
            for bn, bk, w in ((16, 256, 4), (32, 256, 4), (64, 256, 8))]


def pick_config(n: int, k: int, group: int, programs_per_row: int = 1) -> dict:
    """A fixed rule (no autotune sweep): enough N tiles to fill the GPU, long K tiles,
    whole groups per K tile (BLOCK_K >= GROUP, both powers of two)."""
    interpreted = triton_interpreted()
    chosen = configs()[0]
    for cfg in reversed(configs()) if interpreted else configs():
        if interpreted or triton.cdiv(n, cfg["BLOCK_N"]) * programs_per_row >= 256:
            chosen = cfg
            break
    return dict(chosen, BLOCK_K=max(chosen["BLOCK_K"], group))


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_packed(w, what: str):
    """Constraints every Triton INT4 launcher shares, each with its message."""
    g = w.group_size
    if g < 2 or g & (g - 1):
        raise registry.KernelError(f"{what}: the triton variant needs a power-of-two group "
                                   f"size (tl.arange), got {g}")
    tensors = (w.qweight, w.scales) + (() if w.mins is None else (w.mins,))
    if not all(t.is_contiguous() for t in tensors):
        raise registry.KernelError(f"{what}: qweight, scales and mins must be contiguous")
    if len({t.device for t in tensors}) != 1:
        raise registry.KernelError(f"{what}: qweight, scales and mins are on different devices")
    if w.qweight.device.type != "cuda" and not triton_interpreted():
        raise registry.KernelError(f"{what}: the triton variant needs CUDA tensors "
                                   f"(or TRITON_INTERPRET=1), got {w.qweight.device}")


def mins_arg(w) -> tuple[torch.Tensor, bool]:
    """(the mins pointer argument, HAS_MINS): a symmetric weight passes its scales, unread."""
    return (w.scales, False) if w.mins is None else (w.mins, True)


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
    cfg = pick_config(n, k, w.group_size, x.shape[0])
    grid = (x.shape[0], triton.cdiv(n, cfg["BLOCK_N"]))
    mins, has_mins = mins_arg(w)
    w4a16_gemv_kernel[grid](x, w.qweight, w.scales, mins, out, n, k, GROUP=w.group_size,
                            HAS_MINS=has_mins, **cfg)
    return out

