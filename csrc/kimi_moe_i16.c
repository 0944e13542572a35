/* kimi_moe_i16.c: moe_grouped_w4a16's dot where integer dots run (kh_moe_i16_pick): each route's
 * x row, and each row of h, rounded to int16 per block of 32, then exact integer dots
 * (vpdpwssd on AVX-512 VNNI: kimi_i16_simd.c; vpmaddwd on AVX2: kimi_i16_avx2.c).
 *
 * Why: the float kernel (kimi_gemv_body.h) spends 7 vector instructions on every 32 weights
 * (widen, two table permutes, shift, table multiply, two FMAs) on the two ports that run
 * 512-bit work, so on a 2.1 GHz Xeon the Kimi MoE layer at one token read 17-19 GB/s of the
 * read probe's 25-29 (65%, 2 threads): compute-bound. With AVX-512 VNNI 64 weights cost 8:
 * widen the code bytes to 16 bits, mask, shift, two vpdpwssd, convert, permute the scales,
 * one FMA.
 *
 * Rounding: block b of a row, d = max|x| / 32767 and xq = x * (1/d) rounded half away from zero
 * (kimi_w4a8.c's steps at 16 bits). |x - d xq| <= d / 2 = max|x| / 65534: 2^-16 of the block's
 * largest value, where bfloat16 activations (a GPU's) are off by up to 2^-9 of each value.
 * Codes lie in the kernel set's layout: AVX-512's pair layout, per pair of blocks (j, j+1),
 * [E_j E_j+1 | O_j O_j+1], 16 int16 each (E the even elements, which the low nibbles meet), so
 * 32 code bytes widened to words meet 32 contiguous x codes; or AVX2's planes layout
 * (quantize_row, kimi_i16_avx2.c). Per weight row and x row:
 *     y = sum_pairs sum_lanes s_b d_b dot(q_b, xq_b) + sum_g m_g gsum_g,
 *     gsum_g = sum over the group's blocks of d_b sum(xq_b)   (symmetric rows: m_g = -8 s_g)
 * The dots are exact int32 (at most 4 * 15 * 32767 per lane). The 4-row kernel (one x row, a
 * decode token) and the n-row one (a segment of several routes) run the same operations per
 * (weight row, x row), so a token's result is the same bits whatever shares the call.
 *
 * Used where w4a8_simd runs AVX-512 VNNI, or AVX2 on a CPU (or under a cap) without AVX-512
 * (its cap, and gemv_simd's, cap this too), and both projections have k % 64 == 0;
 * otherwise moe_grouped_w4a16 keeps the float kernels. */
#include "kimi_moe.h"

#define I16_BLOCK 32

/* One row [k] -> its int16 codes, d [k/32] and gsum [k/group]. The codes of blocks (2p, 2p+1)
 * take 64 int16 from 64p, in the pair layout (AVX-512's) or, with `planes`, in the planes
 * layout (kimi_i16_avx2.c): element e of block b at (e % 4) * 16 + (b % 2) * 8 + e / 4. A NaN
 * block keeps its NaN d (codes 0), so the token's output is NaN as the float kernels' would
 * be, not a silent 0. */
static void quantize_row(const float *src, int64_t k, int64_t group, int planes, int16_t *q,
                         float *d, float *gsum)
{
    int64_t nb = k / I16_BLOCK, per_group = group / I16_BLOCK, b;
    for (b = 0; b < nb; b++) {
        int16_t *pair = q + (b / 2) * 64;
        int32_t c[I16_BLOCK], total;
        int j;
        d[b] = kh_round_block(src + b * I16_BLOCK, 32767, 1, c, &total);
        if (planes) {
            for (j = 0; j < I16_BLOCK; j++)
                pair[(j % 4) * 16 + (b % 2) * 8 + j / 4] = (int16_t)c[j];
        } else {
            for (j = 0; j < I16_BLOCK / 2; j++) {  /* even elements, then odd, 32 apart */
                pair[(b % 2) * 16 + j] = (int16_t)c[2 * j];
                pair[(b % 2) * 16 + 32 + j] = (int16_t)c[2 * j + 1];
            }
        }
        if (b % per_group == 0) gsum[b / per_group] = 0.0f;
        gsum[b / per_group] += d[b] * (float)total;
    }
}

/* Prepared rows: q [rows, k] int16 first (each row 64-byte aligned when base is: 2k bytes, k
 * % 64 == 0), then d [rows, k/32], gsum [rows, k/group]. */
static int64_t i16_floats(int64_t rows, int64_t k, int64_t group)
{
    if (k <= 0 || group <= 0 || k % (2 * I16_BLOCK) || group % I16_BLOCK || k % group) return -1;
    return rows * (k / 2) + rows * (k / I16_BLOCK) + rows * (k / group);
}

static KhMoeRows i16_at(float *base, int64_t rows, int64_t k, int64_t group, KhI16Kernels set)
{
    KhMoeRows op = {.k = k, .group = group, .i16k = set};
    op.i16.q = (int16_t *)base;
    op.i16.d = base + rows * (k / 2);
    op.i16.gsum = op.i16.d + rows * (k / I16_BLOCK);
    return op;
}

static KhI16 i16_from(const KhMoeRows *op, int64_t row)
{
    KhI16 x = {op->i16.q + row * op->k, op->i16.d + row * (op->k / I16_BLOCK),
               op->i16.gsum + row * (op->k / op->group)};
    return x;
}

static void i16_prepare(const KhMoeRows *op, const float *src, int64_t row, int64_t count)
{
    int64_t r;
    for (r = 0; r < count; r++) {
        KhI16 x = i16_from(op, row + r);
        quantize_row(src + r * op->k, op->k, op->group, op->i16k.planes, x.q, x.d, x.gsum);
    }
}

static void i16_dots(const KhMoeRows *op, const KhRow *w, int count, int64_t r0, int64_t rows,
                     float *y, int64_t y_stride)
{
    KhI16 x = i16_from(op, r0);
    int t;
    if (rows == 1) { /* 4 weight rows per x load; a short count repeats the last */
        KhRow four[4];
        float y4[4];
        for (t = 0; t < 4; t++) four[t] = w[t < count ? t : count - 1];
        op->i16k.rows4(four, &x, y4);
        for (t = 0; t < count; t++) y[t] = y4[t];
        return;
    }
    for (t = 0; t < count; t++) op->i16k.rows(&w[t], &x, rows, y + t, y_stride);
}

#if KH_HAVE_X86_SIMD
/* One dot per kernel set, so the set a call lays its rows out for is the set its dots run:
 * the caps are read once, in kh_moe_i16_pick. */
static KhMoeRows at_vnni512(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhI16Kernels set = {kh_i16_rows4_vnni512, kh_i16_rows_vnni512, 0};
    return i16_at(base, rows, k, group, set);
}

static KhMoeRows at_avx2(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhI16Kernels set = {kh_i16_rows4_avx2, kh_i16_rows_avx2, 1};
    return i16_at(base, rows, k, group, set);
}

static const KhMoeDot i16_vnni512 = {4, i16_floats, at_vnni512, i16_prepare, i16_dots};
static const KhMoeDot i16_avx2 = {4, i16_floats, at_avx2, i16_prepare, i16_dots};
#endif

const KhMoeDot *kh_moe_i16_pick(int64_t d, int64_t inner, int64_t group)
{
#if KH_HAVE_X86_SIMD
    /* AVX-512 VNNI at w4a8_simd's 3; AVX2 at 1 and 2, but not beside AVX-512's float kernels
     * (an AVX-512 CPU without VNNI): capped at AVX2 on the Xeon the int16 dots read 60-65% of
     * the probe at one token, AVX-512's float kernels 65-70% (measured before
     * kimi_i16_avx2.c's planes layout, not since) */
    int level = w4a8_simd(-1);
    if (level < 1 || (level < 3 && gemv_simd(-1) == 2)) return 0;
    if (i16_floats(1, d, group) < 0 || i16_floats(1, inner, group) < 0) return 0;
    return level == 3 ? &i16_vnni512 : &i16_avx2;
#else
    (void)d, (void)inner, (void)group;
    return 0;
#endif
}
