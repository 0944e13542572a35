"""w4a16_gemv in Triton: a real GEMV, one program per (row of x, BLOCK_N outputs).

The weight is read as it lies on disk (format version 2), its codes as 32-bit words: word w of
a row holds elements 8w..8w+7, element 8w+i in nibble i. A K tile is [BLOCK_N rows, BLOCK_G
groups x G/8 words], a row's words side by side: each thread loads whole groups, 16 bytes of
codes for G = 32, and a code becomes a float by the exponent-bias trick (the nibble or'ed into
the mantissa of 2^23, minus 2^23: two ALU ops, no int-to-float conversion, whose throughput is a
quarter of the FMA's). x is loaded per nibble in the codes' [BLOCK_N, words] shape (the same
address for every row of the tile, so it comes from L1), and the words are summed per group
within their thread (a reshape to [BLOCK_N, BLOCK_G, G/8]): one register layout through the K
loop, no shared-memory relayout, no barrier. The tile is 2-D on purpose: as [BN, BG, G/8] the
rows and groups axes tie for the load coalescer, which triton 3.6 (the GPU image) and 3.9 (CI)
break in opposite directions, so one of them always met scales laid out unlike the codes and
moved them through shared memory every K step (tests/ops/test_triton_compile.py reads the SASS
under both). Scales (and mins) load with their codes, and the next tile's codes and scales are
loaded before the current one is multiplied.
Per group: s * dot(q - 8, x) (symmetric) or s * dot(q, x) + m * sum(x); per-group
partial sums stay elementwise in [BLOCK_N, BLOCK_G] and are reduced once at the end.
Memory traffic per output element: K/2 code bytes + 2*K/G bytes of scale (4*K/G with mins),
once per row of x (rows of one N tile run next to each other, so rows after the first hit L2);
x is K elements per row, from cache.

Outputs are written in out's dtype (x's when out is None): a bf16 step has no casts around its
GEMVs. Written against basic tl ops only, so it runs on triton 3.6 (GPU image) and 3.9 (CI),
and under TRITON_INTERPRET=1 on the CPU.
"""
import os

import torch
import triton
import triton.language as tl

from engined.ops import int4_format, registry

MANTISSA_BIAS = tl.constexpr(0x4B000000)  # the bits of 2^23 as fp32: (q | bias) as a float is 2^23 + q
NIBBLE_MASK = tl.constexpr(0x4B00000F)
FLOAT_2_23 = tl.constexpr(8388608.0)
FLOAT_2_23_PLUS_8 = tl.constexpr(8388616.0)  # 2^23 + q - this = q - 8: a symmetric weight's code


@triton.jit
def int4_dot(x_row, c_rows, s_rows, m_rows, offs_n, n_mask, NG,
             GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
             HAS_MINS: tl.constexpr, GPU_ORDER: tl.constexpr):
    """acc[i] = sum_k x_row[k] * W[offs_n[i], k] over the NG groups of a row -> fp32 [BLOCK_N].
    c_rows: the weight's code words (int32, G/8 per group) at row 0, 16-byte aligned for 16-byte
    loads (a caller offsets it by whole rows as rows * NG * (G/8), which the compiler can see is
    a multiple of G/8 words); s_rows, m_rows: its
    scales and mins at row 0 (m_rows unread without mins: HAS_MINS false, w = s*(q - 8)).
    GPU_ORDER: the codes were permuted at load (int4_format.gpu_order): nibble i of a group's
    word w is element i*(G/8) + w, so each nibble position's x is G/8 contiguous values (one
    vector load); else element 8w + i, as on disk (G/8 scalar loads 8 apart)."""
    WPG: tl.constexpr = GROUP // 8
    W_STEP: tl.constexpr = 1 if GPU_ORDER else 8     # x's distance between a group's words
    I_STEP: tl.constexpr = WPG if GPU_ORDER else 1   # and between nibble positions
    WORDS: tl.constexpr = BLOCK_G * WPG
    offs_g = tl.arange(0, BLOCK_G)
    offs_j = tl.arange(0, WORDS)                     # a tile's words in a row: group j // WPG
    rows = offs_n.to(tl.int64) * NG
    zero_n = offs_n[:, None] * 0                     # x's address repeats over the rows
    acc = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
    codes, s, m = words_tile(c_rows, s_rows, m_rows, rows, 0, offs_g, offs_j, n_mask, NG, WPG,
                             HAS_MINS)
    for g0 in range(0, NG, BLOCK_G):
        # the next tile, loaded before this one is multiplied
        codes_next, s_next, m_next = words_tile(c_rows, s_rows, m_rows, rows, g0 + BLOCK_G,
                                                offs_g, offs_j, n_mask, NG, WPG, HAS_MINS)
        g_of_j = g0 + offs_j // WPG
        at_x = x_row + zero_n + (g_of_j * GROUP + (offs_j % WPG) * W_STEP)[None, :]
        x_mask = (g_of_j < NG)[None, :] & (zero_n == 0)      # in the codes' [BN, WORDS] shape
        words = codes.to(tl.uint32, bitcast=True)            # logical shifts
        dot = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
        if HAS_MINS:
            x_sum = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
        for i in tl.static_range(8):
            xi = tl.load(at_x + i * I_STEP, mask=x_mask, other=0.0).to(tl.float32)
            # (v | bias) & (bias | 0xF) == (v & 0xF) | bias: 2^23 + q as fp32 bits
            qi = (((words >> (4 * i)) | MANTISSA_BIAS) & NIBBLE_MASK).to(tl.float32, bitcast=True)
            if HAS_MINS:
                dot += (qi - FLOAT_2_23) * xi                # q
                x_sum += xi
            else:
                dot += (qi - FLOAT_2_23_PLUS_8) * xi         # q - 8, exact
        # [BN, WORDS] -> [BN, BG]: a group's words lie in one thread, so these sums stay in it
        group_dot = tl.sum(tl.reshape(dot, [BLOCK_N, BLOCK_G, WPG]), axis=2)
        if HAS_MINS:
            group_x = tl.sum(tl.reshape(x_sum, [BLOCK_N, BLOCK_G, WPG]), axis=2)
            acc += s.to(tl.float32) * group_dot + m.to(tl.float32) * group_x
        else:
            acc += s.to(tl.float32) * group_dot
        codes, s, m = codes_next, s_next, m_next
    return tl.sum(acc, axis=1)


@triton.jit
def words_tile(c_rows, s_rows, m_rows, rows, g0, offs_g, offs_j, n_mask, NG,
               WPG: tl.constexpr, HAS_MINS: tl.constexpr):
    """int4_dot's K tile at group g0 of rows `rows` (row * NG): (codes [BN, BG * WPG] int32, a
    row's words of groups g0.. in a row; scales [BN, BG]; mins [BN, BG], or the scales again
    without mins); past NG or N: zeros."""
    g = g0 + offs_g
    s_mask = n_mask[:, None] & (g < NG)[None, :]
    c_mask = n_mask[:, None] & ((g0 + offs_j // WPG) < NG)[None, :]
    codes = tl.load(c_rows + rows[:, None] * WPG + g0 * WPG + offs_j[None, :], mask=c_mask, other=0)
    s = tl.load(s_rows + rows[:, None] + g[None, :], mask=s_mask, other=0.0)
    m = tl.load(m_rows + rows[:, None] + g[None, :], mask=s_mask, other=0.0) if HAS_MINS else s
    return codes, s, m


@triton.jit
def int4_tile(c_rows, s_rows, m_rows, rows, g, offs_w, n_mask, NG, WPG: tl.constexpr,
              HAS_MINS: tl.constexpr):
    """The GEMMs' K tile (w4a16_gemm, moe_grouped's tl.dot variant) of rows `rows` (row * NG)
    and groups g: (codes [BN, BG, WPG] int32, scales [BN, BG], mins [BN, BG] or the scales
    again without mins); past NG or N: zeros."""
    s_mask = n_mask[:, None] & (g < NG)[None, :]
    codes = tl.load(c_rows + (rows[:, None, None] + g[None, :, None]) * WPG + offs_w[None, None, :],
                    mask=s_mask[:, :, None], other=0)
    s = tl.load(s_rows + rows[:, None] + g[None, :], mask=s_mask, other=0.0)
    m = tl.load(m_rows + rows[:, None] + g[None, :], mask=s_mask, other=0.0) if HAS_MINS else s
    return codes, s, m


@triton.jit
def w4a16_gemv_kernel(x_ptr, c_ptr, s_ptr, m_ptr, y_ptr, N, K,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                      HAS_MINS: tl.constexpr, SWIGLU: tl.constexpr, GPU_ORDER: tl.constexpr):
    """SWIGLU: the weight is [gate; up] stacked ([2N, K]): y = silu(x gate^T) * (x up^T) [M, N]."""
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    ng = K // GROUP
    x_row = x_ptr + row.to(tl.int64) * K
    acc = int4_dot(x_row, c_ptr, s_ptr, m_ptr, offs_n, n_mask, ng, GROUP, BLOCK_N, BLOCK_G,
                   HAS_MINS, GPU_ORDER)
    if SWIGLU:
        up = int4_dot(x_row, c_ptr, s_ptr, m_ptr, offs_n + N, n_mask, ng, GROUP, BLOCK_N,
                      BLOCK_G, HAS_MINS, GPU_ORDER)
        acc = acc * tl.sigmoid(acc) * up
    tl.store(y_ptr + row.to(tl.int64) * N + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


def configs() -> list[dict]:
    """The launch configurations: BLOCK_N x BLOCK_G = one group a thread at 4 warps (a thread
    holding two rows of one group would load x twice: Triton's loads are not merged)."""
    return [dict(BLOCK_N=128 // bg, BLOCK_G=bg, num_warps=4, num_stages=1)
            for bg in (4, 8, 16, 32)]


def pick_config(n: int, k: int, group: int, programs_per_row: int = 1) -> dict:
    """A fixed rule (no autotune sweep): the widest tile of whole groups that divides a row's
    groups (no idle lanes in the last tile), which also gives the most programs per output
    (o_proj 2304 x 4096: 576 programs; q/k/v 12288 x 2304: 768)."""
    groups = k // group
    for cfg in reversed(configs()):
        if groups % cfg["BLOCK_G"] == 0 or cfg["BLOCK_G"] == configs()[0]["BLOCK_G"]:
            return dict(cfg)
    raise AssertionError("unreachable")


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_packed(w, what: str):
    """Constraints every Triton INT4 launcher shares, each with its message."""
    g = w.group_size
    if g < 8 or g & (g - 1):
        raise registry.KernelError(f"{what}: the triton variant needs a power-of-two group "
                                   f"size of 8 or more (whole 32-bit code words), got {g}")
    tensors = (w.qweight, w.scales) + (() if w.mins is None else (w.mins,))
    if not all(t.is_contiguous() for t in tensors):
        raise registry.KernelError(f"{what}: qweight, scales and mins must be contiguous")
    if len({t.device for t in tensors}) != 1:
        raise registry.KernelError(f"{what}: qweight, scales and mins are on different devices")
    if w.qweight.device.type != "cuda" and not triton_interpreted():
        raise registry.KernelError(f"{what}: the triton variant needs CUDA tensors "
                                   f"(or TRITON_INTERPRET=1), got {w.qweight.device}")


def code_words(w) -> torch.Tensor:
    """qweight's bytes as int32 words (4 bytes, 8 codes each; little-endian: element 8w+i in
    nibble i of word w), no copy."""
    return w.qweight.view(torch.int32)


def mins_arg(w) -> tuple[torch.Tensor, bool]:
    """(the mins pointer argument, HAS_MINS): a symmetric weight passes its scales, unread."""
    return (w.scales, False) if w.mins is None else (w.mins, True)


def as_rows(x: torch.Tensor, k: int, device, what: str) -> torch.Tensor:
    """x [M, K] as the kernels read it: any float dtype (converted in registers), contiguous."""
    if x.dim() != 2 or x.shape[1] != k:
        raise registry.KernelError(f"{what}: x must be [M, {k}], got {list(x.shape)}")
    if x.device != device:
        raise registry.KernelError(f"{what}: x is on {x.device}, the weight on {device}")
    return x.contiguous()


OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def out_buffer(out, shape, device, what: str, dtype=torch.float32) -> torch.Tensor:
    """out, checked (contiguous, the shape, a float dtype the kernels store), or a new one."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != shape or out.dtype not in OUT_DTYPES or not out.is_contiguous() \
            or out.device != device:
        raise registry.KernelError(f"{what}: out must be a contiguous fp32, bf16 or fp16 "
                                   f"{list(shape)} on {device}, got {out.dtype} "
                                   f"{list(out.shape)} on {out.device}")
    return out


def launch_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out, swiglu: bool, what: str):
    check_packed(w, what)
    n, k = w.shape
    if swiglu:
        if n % 2:
            raise registry.KernelError(f"{what}: a stacked gate/up weight has an even row count")
        n //= 2
    x = as_rows(x, k, w.qweight.device, what)
    out = out_buffer(out, (x.shape[0], n), w.qweight.device, what, x.dtype)
    cfg = pick_config(n, k, w.group_size, x.shape[0])
    grid = (x.shape[0], triton.cdiv(n, cfg["BLOCK_N"]))
    mins, has_mins = mins_arg(w)
    w4a16_gemv_kernel[grid](x, code_words(w), w.scales, mins, out, n, k, GROUP=w.group_size,
                            HAS_MINS=has_mins, SWIGLU=swiglu, GPU_ORDER=w.gpu_order, **cfg)
    return out


def w4a16_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    return launch_gemv(x, w, out, False, "w4a16_gemv")


def w4a16_swiglu(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """w: gate and up stacked [2F, K] -> silu(x gate^T) * (x up^T): [M, F] in x's dtype."""
    return launch_gemv(x, w, out, True, "w4a16_swiglu")
