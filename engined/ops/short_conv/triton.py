"""short_conv in Triton: program (token tile, channel tile) sums each channel's W taps over
its inputs (the window's columns for the first W-1 tokens, x's rows after) in fp32, applies
SiLU and stores each part [T, C/parts] contiguous. The programs of the first token tile then
move their channels' windows on to the chunk's last W-1 inputs, after a barrier: they are the
only readers of those windows. One launch in place of the seven aten kernels of the eager form
(cat, casts, unfold's GEMM, copy, SiLU) and of the copies fla's chunk_kda made of q, k and v
split from one [T, 3W] tensor. Memory traffic: x read about once (the W taps of a tile
overlap in cache), the output written once; a 2048-token chunk of Kimi-Linear's 3 x 4096
channels in bf16 is ~100 MB each way.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.short_conv.reference import check_inputs
from engined.ops.w4a16_gemv.triton import out_buffer

BLOCK_T, BLOCK_C = 32, 128   # the first tile's tokens cover the window: BLOCK_T >= W - 1


@triton.jit(do_not_specialize=["T"])   # a chunk and its tail (T = 1, 7, 2048) share one compile
def short_conv_kernel(x_ptr, w_ptr, win_ptr, y_ptr, T, C, CP, W: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr):
    tile_t = tl.program_id(0)
    t = tile_t * BLOCK_T + tl.arange(0, BLOCK_T)                     # [BT] tokens
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)           # [BC] channels
    c_mask = c < C
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(W):
        src = t + (j - (W - 1))            # the input tap j reads: x's row, or (< 0) the window's
        in_x = ((src >= 0) & (src < T))[:, None] & c_mask[None, :]
        in_win = (src < 0)[:, None] & c_mask[None, :]
        xv = tl.load(x_ptr + src.to(tl.int64)[:, None] * C + c[None, :], mask=in_x, other=0.0)
        wv = tl.load(win_ptr + c[None, :] * (W - 1) + (src + W - 1)[:, None], mask=in_win,
                     other=0.0)
        tap = tl.load(w_ptr + c * W + j, mask=c_mask, other=0.0).to(tl.float32)
        acc += (xv.to(tl.float32) + wv.to(tl.float32)) * tap[None, :]
    y = acc / (1 + tl.exp(-acc))                                     # SiLU
    part = (c // CP).to(tl.int64)
    y_at = y_ptr + part[None, :] * T * CP + t.to(tl.int64)[:, None] * CP + (c % CP)[None, :]
    tl.store(y_at, y.to(y_ptr.dtype.element_ty), mask=(t < T)[:, None] & c_mask[None, :])
    if tile_t == 0:                        # the window: the last W-1 inputs of window + x
        col = tl.arange(0, BLOCK_W)
        last = T + col - (W - 1)        # its x rows (< 0: the old window's columns)
        keep = c_mask[:, None] & (col < W - 1)[None, :]
        x_last = tl.load(x_ptr + last.to(tl.int64)[None, :] * C + c[:, None],
                     mask=keep & (last >= 0)[None, :], other=0.0)
        win_last = tl.load(win_ptr + c[:, None] * (W - 1) + (T + col)[None, :],
                     mask=keep & (last < 0)[None, :], other=0.0)
        moved = tl.where((last >= 0)[None, :], x_last.to(tl.float32), win_last.to(tl.float32))
        tl.debug_barrier()                 # every read of the old window is done
        tl.store(win_ptr + c[:, None] * (W - 1) + col[None, :],
                 moved.to(win_ptr.dtype.element_ty), mask=keep)


def short_conv(x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor, parts: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    check_inputs(x, weight, window, parts)
    t, c = x.shape
    w = weight.shape[-1]
    if not (x.is_contiguous() and weight.is_contiguous() and window.is_contiguous()):
        raise registry.KernelError("short_conv: x, weight and window must be contiguous")
    if w - 1 > BLOCK_T:
        raise registry.KernelError(f"short_conv: at most {BLOCK_T + 1} taps, got {w}")
    out = out_buffer(out, (parts, t, c // parts), x.device, "short_conv", x.dtype)
    short_conv_kernel[(triton.cdiv(t, BLOCK_T), triton.cdiv(c, BLOCK_C))](
        x, weight, window, out, t, c, c // parts, W=w, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C,
        BLOCK_W=max(1, triton.next_power_of_2(w - 1)), num_warps=4)
    return out
