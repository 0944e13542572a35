"""w4a16_gemm in Triton: prefill rows (T > 8) through tensor cores, tl.dot on BLOCK_M x BLOCK_N
tiles with the INT4 weight dequantized in the K loop (Marlin's and gpt-fast's int4 idea, kept
to basic tl ops): no dequantized copy of W in memory, one launch per projection.

A K tile is BLOCK_G whole groups: the codes load as [BLOCK_N, BLOCK_G, G/8] int32 words (the
same loads as the GEMV's int4_tile), the nibbles become floats by the exponent-bias trick, the
scales (and mins) multiply them per group, and the [BLOCK_N, BLOCK_K] tile meets x's
[BLOCK_M, BLOCK_K] in tl.dot, in x's dtype (bf16 on a GPU, fp32 accumulate) as two products,
w's bf16 rounding and its remainder, so W keeps ~16 bits as in the fp32 reference (a code
times an fp16 scale has 15); fp32 inputs use the exact "ieee" product. GPU_ORDER codes (nibble i of word w is element i*(G/8) + w) are
put back in element order by one permute of the tile's registers.

Memory traffic per output tile: K/2 code bytes and 2K/G (4K/G with mins) scale bytes per
weight row, once per BLOCK_M rows of x (not once per row, as the GEMV reads them); x's
BLOCK_M x K once per BLOCK_N outputs. Runs on triton 3.6 (GPU image) and 3.9 (CI), and under
TRITON_INTERPRET=1.
"""
import torch
import triton
import triton.language as tl

from engined.ops import int4_format, registry
from engined.ops.w4a16_gemv.triton import (FLOAT_2_23, MANTISSA_BIAS, NIBBLE_MASK, OUT_DTYPES,
                                           as_rows, check_packed, code_words, int4_tile, mins_arg,
                                           triton_interpreted)


@triton.jit
def w4a16_gemm_kernel(x_ptr, c_ptr, s_ptr, m_ptr, y_ptr, M, N, K,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_G: tl.constexpr, HAS_MINS: tl.constexpr, GPU_ORDER: tl.constexpr,
                      IEEE: tl.constexpr, INTERPRETED: tl.constexpr):
    WPG: tl.constexpr = GROUP // 8
    BLOCK_K: tl.constexpr = BLOCK_G * GROUP
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    ng = K // GROUP
    rows = offs_n.to(tl.int64) * ng
    offs_g, offs_w, shifts = tl.arange(0, BLOCK_G), tl.arange(0, WPG), tl.arange(0, 8) * 4
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, ng, BLOCK_G):
        g = g0 + offs_g
        codes, s, m = int4_tile(c_ptr, s_ptr, m_ptr, rows, g, offs_w, n_mask, ng, WPG, HAS_MINS)
        words = codes.to(tl.uint32, bitcast=True)[:, :, :, None] >> shifts[None, None, None, :]
        q = ((words | MANTISSA_BIAS) & NIBBLE_MASK).to(tl.float32, bitcast=True) - FLOAT_2_23
        if GPU_ORDER:
            q = tl.permute(q, (0, 1, 3, 2))                       # [BN, BG, 8, WPG]
        q = tl.reshape(q, (BLOCK_N, BLOCK_G, GROUP))              # element order in each group
        if HAS_MINS:
            w = q * s.to(tl.float32)[:, :, None] + m.to(tl.float32)[:, :, None]
        else:
            w = (q - 8.0) * s.to(tl.float32)[:, :, None]
        w = tl.reshape(w, (BLOCK_N, BLOCK_K))
        offs_k = g0 * GROUP + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:  # w = hi + lo in x's 16-bit type: two tensor-core products, w kept to ~2^-16
            hi = w.to(x.dtype)
            lo = (w - hi.to(tl.float32)).to(x.dtype)
            if INTERPRETED:  # the interpreter's 16-bit tl.dot multiplies raw bits: exact fp32
                x32 = x.to(tl.float32)
                acc = tl.dot(x32, tl.trans(hi.to(tl.float32)), acc, input_precision="ieee")
                acc = tl.dot(x32, tl.trans(lo.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(hi), acc)
                acc = tl.dot(x, tl.trans(lo), acc)
    y = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def pick_config(m: int, group: int) -> dict:
    """A fixed rule: 64 outputs by up to 64 rows, K tiles of 64 inputs (whole groups; at least
    16 for tl.dot). No autotune: its first call would time configs inside a prefill."""
    return dict(BLOCK_M=16 if m <= 16 else 32 if m <= 32 else 64, BLOCK_N=64,
                BLOCK_G=max(1, 64 // group), num_warps=4, num_stages=2)


def w4a16_gemm(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    check_packed(w, "w4a16_gemm")
    n, k = w.shape
    x = as_rows(x, k, w.qweight.device, "w4a16_gemm")
    if x.dtype not in OUT_DTYPES:
        raise registry.KernelError(f"w4a16_gemm: x must be fp32, bf16 or fp16, got {x.dtype}")
    m = x.shape[0]
    y = torch.empty((m, n), dtype=torch.float32, device=x.device) if out is None else out
    if y.shape != (m, n) or y.dtype not in (torch.float32, x.dtype) or not y.is_contiguous():
        raise registry.KernelError(f"w4a16_gemm: out must be a contiguous fp32 or {x.dtype} "
                                   f"[{m}, {n}], got {y.dtype} {list(y.shape)}")
    cfg = pick_config(m, w.group_size)
    mins, has_mins = mins_arg(w)
    w4a16_gemm_kernel[(triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))](
        x, code_words(w), w.scales, mins, y, m, n, k, GROUP=w.group_size, HAS_MINS=has_mins,
        GPU_ORDER=w.gpu_order, IEEE=x.dtype == torch.float32, INTERPRETED=triton_interpreted(),
        **cfg)
    return y
