"""moe_grouped in Triton for prefill chunks: per (expert, BLOCK_N outputs) program, the expert's
routes taken BLOCK_M at a time through tl.dot, each INT4 weight tile dequantized once per
BLOCK_M routes (the `triton` variant reads it once per route, from cache after the first).
Offsets cover every expert, so the grid is fixed and nothing syncs with the host.

A K tile is BLOCK_G whole groups, decoded as w4a16_gemm's Triton tiles are (code words, the
exponent-bias trick, scales and mins per group, the GPU order undone by a register permute).
Precision as the fp32 reference: fp32 rows use the "ieee" product; 16-bit rows (a GPU's bf16
activations) meet W as two 16-bit products (its rounding and the remainder), and the fp32
SwiGLU rows h of the down projection are split the same way (three products).

Memory traffic per expert and output tile: its K/2 code bytes and 2K/G (4K/G with mins) scale
bytes per row, once per BLOCK_M routes; the routes' x rows once per BLOCK_N outputs. Two
launches: gate/up with the SwiGLU epilogue into h [R, I] fp32, then down into y [R, D]; the
weighted sum per token is routes.combine.
"""
import torch
import triton
import triton.language as tl

from engined.ops.moe_grouped.routes import combine, sort_routes
from engined.ops.moe_grouped.triton import check_triton_inputs
from engined.ops.w4a16_gemv.triton import (FLOAT_2_23, MANTISSA_BIAS, NIBBLE_MASK,
                                           code_words, int4_tile, mins_arg, triton_interpreted)


@triton.jit
def dequant_tile(c_ptr, s_ptr, m_ptr, rows, g, offs_w, n_mask, NG, GROUP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_MINS: tl.constexpr,
                 GPU_ORDER: tl.constexpr):
    """Weight rows `rows` (row * NG), groups g -> W [BLOCK_N, BLOCK_G * GROUP] fp32."""
    WPG: tl.constexpr = GROUP // 8
    codes, s, m = int4_tile(c_ptr, s_ptr, m_ptr, rows, g, offs_w, n_mask, NG, WPG, HAS_MINS)
    shifts = tl.arange(0, 8) * 4
    words = codes.to(tl.uint32, bitcast=True)[:, :, :, None] >> shifts[None, None, None, :]
    q = ((words | MANTISSA_BIAS) & NIBBLE_MASK).to(tl.float32, bitcast=True) - FLOAT_2_23
    if GPU_ORDER:
        q = tl.permute(q, (0, 1, 3, 2))
    q = tl.reshape(q, (BLOCK_N, BLOCK_G, GROUP))
    if HAS_MINS:
        w = q * s.to(tl.float32)[:, :, None] + m.to(tl.float32)[:, :, None]
    else:
        w = (q - 8.0) * s.to(tl.float32)[:, :, None]
    return tl.reshape(w, (BLOCK_N, BLOCK_G * GROUP))


@triton.jit
def dot16(a, b, acc, INTERPRETED: tl.constexpr):
    """acc + a @ b for 16-bit a, b (the interpreter's 16-bit tl.dot multiplies raw bits)."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def split_dot(a, w, acc, IEEE: tl.constexpr, A_EXACT: tl.constexpr, DTYPE: tl.constexpr,
              INTERPRETED: tl.constexpr):
    """acc + a @ w^T, a [BM, BK] (fp32 or DTYPE), w [BN, BK] fp32, to ~16 bits of each."""
    if IEEE:
        return tl.dot(a.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
    w_hi = w.to(DTYPE)
    w_lo = (w - w_hi.to(tl.float32)).to(DTYPE)
    a_hi = a.to(DTYPE)
    acc = dot16(a_hi, tl.trans(w_hi), acc, INTERPRETED)
    acc = dot16(a_hi, tl.trans(w_lo), acc, INTERPRETED)
    if not A_EXACT:
        a_lo = (a.to(tl.float32) - a_hi.to(tl.float32)).to(DTYPE)
        acc = dot16(a_lo, tl.trans(w_hi), acc, INTERPRETED)
    return acc


@triton.jit
def moe_grouped_dot_kernel(x_ptr, token_ptr, offsets_ptr, aq_ptr, as_ptr, am_ptr, bq_ptr, bs_ptr,
                           bm_ptr, y_ptr, N, K, GATHER: tl.constexpr, SWIGLU: tl.constexpr,
                           GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_G: tl.constexpr, HAS_MINS: tl.constexpr, GPU_ORDER: tl.constexpr,
                           IEEE: tl.constexpr, A_EXACT: tl.constexpr, DTYPE: tl.constexpr,
                           INTERPRETED: tl.constexpr):
    BLOCK_K: tl.constexpr = BLOCK_G * GROUP
    expert = tl.program_id(0).to(tl.int64)
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    ng = K // GROUP
    rows = (expert * N + offs_n.to(tl.int64)) * ng          # this expert's weight rows
    offs_g, offs_w = tl.arange(0, BLOCK_G), tl.arange(0, GROUP // 8)
    for r0 in range(start, end, BLOCK_M):
        offs_r = r0 + tl.arange(0, BLOCK_M)
        r_mask = offs_r < end
        src = tl.load(token_ptr + offs_r, mask=r_mask, other=0) if GATHER else offs_r
        x_rows = x_ptr + src.to(tl.int64)[:, None] * K
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for g0 in range(0, ng, BLOCK_G):
            g = g0 + offs_g
            offs_k = g0 * GROUP + tl.arange(0, BLOCK_K)
            x = tl.load(x_rows + offs_k[None, :], mask=r_mask[:, None] & (offs_k < K)[None, :],
                        other=0.0)
            w = dequant_tile(aq_ptr, as_ptr, am_ptr, rows, g, offs_w, n_mask, ng, GROUP, BLOCK_N,
                             BLOCK_G, HAS_MINS, GPU_ORDER)
            acc = split_dot(x, w, acc, IEEE, A_EXACT, DTYPE, INTERPRETED)
            if SWIGLU:
                w = dequant_tile(bq_ptr, bs_ptr, bm_ptr, rows, g, offs_w, n_mask, ng, GROUP,
                                 BLOCK_N, BLOCK_G, HAS_MINS, GPU_ORDER)
                up = split_dot(x, w, up, IEEE, A_EXACT, DTYPE, INTERPRETED)
        if SWIGLU:
            acc = acc * tl.sigmoid(acc) * up
        y = y_ptr + offs_r.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(y, acc, mask=r_mask[:, None] & n_mask[None, :])


def pick_config(group: int) -> dict:
    """A fixed rule: 16 routes (a 256-token chunk gives an expert 8 of its 2048 on average) by
    64 outputs, K tiles of 64 inputs (whole groups)."""
    return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_G=max(1, 64 // group), num_warps=4, num_stages=2)


def _launch(x, token, offsets, a, b, out_rows: int, gather: bool, model_dtype: torch.dtype):
    num_experts, n, k = a.shape
    y = torch.empty((out_rows, n), dtype=torch.float32, device=x.device)
    cfg = pick_config(a.group_size)
    am, has_mins = mins_arg(a)
    b = b or a                               # down: one stack, b unread (SWIGLU false)
    moe_grouped_dot_kernel[(num_experts, triton.cdiv(n, cfg["BLOCK_N"]))](
        x, token, offsets, code_words(a), a.scales, am, code_words(b), b.scales, mins_arg(b)[0], y,
        n, k, GATHER=gather, SWIGLU=b is not a, GROUP=a.group_size, HAS_MINS=has_mins,
        GPU_ORDER=a.gpu_order, IEEE=model_dtype == torch.float32, A_EXACT=x.dtype != torch.float32,
        DTYPE=tl.float16 if model_dtype == torch.float16 else tl.bfloat16,
        INTERPRETED=triton_interpreted(), **cfg)
    return y


def moe_grouped(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    check_triton_inputs(x, w1, w3, w2, experts, weights)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"moe_grouped: x must be fp32, bf16 or fp16, got {x.dtype}")
    x = x.contiguous()
    routes = sort_routes(experts, w1.num_experts)
    r = routes.token.numel()
    h = _launch(x, routes.token, routes.offsets, w1, w3, r, True, x.dtype)       # [R, I] fp32
    y = _launch(h, routes.token, routes.offsets, w2, None, r, False, x.dtype)    # [R, D]
    return combine(y, routes, weights, out)
