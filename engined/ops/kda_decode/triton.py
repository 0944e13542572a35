"""kda_decode in Triton: one program per (row, head) runs the head's whole decode step on its
slot (short conv + SiLU of q, k, v, L2 norms, decay gate, delta rule, gated RMS norm), the
conv windows and the state read and written in place: one launch per KDA layer, no gather,
no host sync, so a CUDA graph can hold it.
"""
import torch
import triton
import triton.language as tl

from engined.layers.kda import L2_EPS  # registry.lazy imports this after engined.ops: no cycle
from engined.ops import registry
from engined.ops.kda_decode.reference import check_inputs, copy_source
from engined.ops.w4a16_gemv.triton import triton_interpreted

NUM_WARPS = 8  # the [K, V] fp32 state tile is 64 KiB at K = V = 128: 64 registers a thread


@triton.jit
def _conv_silu(x_at, win_at, w_at, offs, mask, C: tl.constexpr, BLOCK_C: tl.constexpr):
    """SiLU(causal depthwise conv) of the channels `offs`, fp32, and their windows shifted by
    one input (to store once every window is read). x_at: the channels' inputs; win_at: their
    windows [., C-1] (the C-1 inputs before x); w_at: their taps [., C]."""
    t = tl.arange(0, BLOCK_C)[None, :]
    x = tl.load(x_at + offs, mask=mask, other=0.0)
    win_rows = win_at + offs[:, None] * (C - 1) + t
    win = tl.load(win_rows, mask=mask[:, None] & (t < C - 1), other=0.0)
    taps = tl.where(t == C - 1, x[:, None], win).to(tl.float32)          # inputs x-C+1 .. x
    w = tl.load(w_at + offs[:, None] * C + t, mask=mask[:, None] & (t < C), other=0.0)
    y = tl.sum(taps * w.to(tl.float32), axis=1)
    shifted = tl.load(win_rows + 1, mask=mask[:, None] & (t < C - 2), other=0.0)
    return y / (1 + tl.exp(-y)), tl.where(t == C - 2, x[:, None], shifted)


@triton.jit
def _low_rank(w_at, x_at, offs, mask, R: tl.constexpr, BLOCK_R: tl.constexpr):
    """sum_r w[offs, r] x[r], fp32: a head's rows of an [., R] weight times the [R] vector x."""
    offs_r = tl.arange(0, BLOCK_R)
    x = tl.load(x_at + offs_r, mask=offs_r < R, other=0.0).to(tl.float32)
    w = tl.load(w_at + offs[:, None] * R + offs_r[None, :], mask=mask[:, None] & (offs_r < R)[None, :],
                other=0.0)
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1)


@triton.jit
def kda_decode_kernel(qkv_ptr, low_ptr, fb_ptr, gb_ptr, cw_ptr, conv_ptr, s_ptr, slots_ptr,
                      a_log_ptr, dt_ptr, nw_ptr, y_ptr, eps, scale, H,
                      K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, L2_EPS: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (row, head). Memory traffic per (row, head) at K = V = 128, C = 4, bf16
    activations and weights: the fp32 state read and written once (2 x 64 KiB), the head's
    rows of f_b and g_b (2 x 32 KiB, shared by the rows: from L2 after the first), conv taps
    (3 KiB), windows read and written (2 x 2.25 KiB), q/k/v inputs (768 B), y (256 B): about
    200 KiB, the state two thirds of it, for 256 B of output."""
    row, head = tl.program_id(0), tl.program_id(1)
    width = H * K
    offs_k, offs_v = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_V)
    k_mask, v_mask = offs_k < K, offs_v < V
    slot = tl.load(slots_ptr + row).to(tl.int64)
    x_at = qkv_ptr + row * 3 * width + head * K                 # q of this head; k, v at +W, +2W
    win_at = conv_ptr + (slot * 3 * width + head * K) * (C - 1)
    w_at = cw_ptr + head * K * C
    q, q_win = _conv_silu(x_at, win_at, w_at, offs_k, k_mask, C, BLOCK_C)
    k, k_win = _conv_silu(x_at + width, win_at + width * (C - 1), w_at + width * C,
                          offs_k, k_mask, C, BLOCK_C)
    v, v_win = _conv_silu(x_at + 2 * width, win_at + 2 * width * (C - 1), w_at + 2 * width * C,
                          offs_v, v_mask, C, BLOCK_C)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + L2_EPS) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + L2_EPS)

    low_at = low_ptr + row * (2 * K + H)                         # [f_a (K), g_a (K), b (H)]
    r = _low_rank(fb_ptr + head * K * K, low_at, offs_k, k_mask, K, BLOCK_K)
    r += tl.load(dt_ptr + head * K + offs_k, mask=k_mask, other=0.0)
    softplus = tl.maximum(r, 0.0) + tl.log(1 + tl.exp(-tl.abs(r)))
    g = -tl.exp(tl.load(a_log_ptr + head).to(tl.float32)) * softplus   # log-decay per key
    beta = 1 / (1 + tl.exp(-tl.load(low_at + 2 * K + head).to(tl.float32)))

    s_at = s_ptr + ((slot * H + head) * K + offs_k[:, None]) * V + offs_v[None, :]
    s_mask = k_mask[:, None] & v_mask[None, :]
    S = tl.load(s_at, mask=s_mask, other=0.0) * tl.exp(g)[:, None]   # [BLOCK_K, BLOCK_V]
    pred = tl.sum(k[:, None] * S, axis=0)                          # [BLOCK_V]
    S += (beta * k)[:, None] * (v - pred)[None, :]
    o = tl.sum(q[:, None] * S, axis=0)
    tl.store(s_at, S, mask=s_mask)

    z = _low_rank(gb_ptr + head * V * K, low_at + K, offs_v, v_mask, K, BLOCK_K)
    norm_w = tl.load(nw_ptr + offs_v, mask=v_mask, other=0.0).to(tl.float32)
    y = o * tl.rsqrt(tl.sum(o * o, axis=0) / V + eps) * norm_w / (1 + tl.exp(-z))
    tl.store(y_ptr + row * width + head * V + offs_v, y.to(y_ptr.dtype.element_ty), mask=v_mask)

    tl.debug_barrier()  # every thread has read the windows before any is overwritten
    t = tl.arange(0, BLOCK_C)[None, :]
    k_rows = offs_k[:, None] * (C - 1) + t
    v_rows = offs_v[:, None] * (C - 1) + t
    k_keep, v_keep = k_mask[:, None] & (t < C - 1), v_mask[:, None] & (t < C - 1)
    tl.store(win_at + k_rows, q_win, mask=k_keep)
    tl.store(win_at + width * (C - 1) + k_rows, k_win, mask=k_keep)
    tl.store(win_at + 2 * width * (C - 1) + v_rows, v_win, mask=v_keep)


def check_launch(tensors: dict, out, shape, dtype):
    strided = [name for name, t in tensors.items() if not t.is_contiguous()]
    if strided:
        raise registry.KernelError(f"kda_decode: {', '.join(strided)} must be contiguous "
                                   "(the pools are updated in place: a copy would lose the update)")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise registry.KernelError(f"kda_decode: tensors on several devices: {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type != "cuda" and not triton_interpreted():
        raise registry.KernelError(f"kda_decode: the triton variant needs CUDA tensors "
                                   f"(or TRITON_INTERPRET=1), got {device}")
    if out is not None and (tuple(out.shape) != shape or out.dtype != dtype or out.device != device
                            or not out.is_contiguous()):
        raise registry.KernelError(f"kda_decode: out must be a contiguous {dtype} {list(shape)} on "
                                   f"{device}, got {out.dtype} {list(out.shape)} on {out.device}")


def kda_decode(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w,
               eps: float, scale: float, out=None, source=None) -> torch.Tensor:
    b, h, kd, c = check_inputs(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w)
    copy_source(conv, S, slots, source)           # a verify step's draft rows (eager, not graphed)
    check_launch(dict(qkv=qkv, low=low, f_b=f_b, g_b=g_b, conv_w=conv_w, conv=conv, S=S, slots=slots,
                      A_log=A_log, dt_bias=dt_bias, o_norm_w=o_norm_w), out, (b, h * kd), qkv.dtype)
    y = torch.empty((b, h * kd), dtype=qkv.dtype, device=qkv.device) if out is None else out
    block = triton.next_power_of_2(kd)
    kda_decode_kernel[(b, h)](
        qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w, y, eps, scale, h,
        K=kd, V=kd, C=c, L2_EPS=L2_EPS, BLOCK_K=block, BLOCK_V=block,
        BLOCK_C=triton.next_power_of_2(c), num_warps=NUM_WARPS)
    return y
