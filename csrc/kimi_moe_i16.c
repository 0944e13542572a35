/* kimi_moe_i16.c: moe_grouped_w4a16's dot on CPUs with AVX-512 VNNI (kh_moe_i16): each route's
 * x row, and each row of h, rounded to int16 per block of 32, then integer dots with vpdpwssd.
 *
 * Why: the float kernel (kimi_gemv_body.h) spends 7 vector instructions on every 32 weights
 * (widen, two table permutes, shift, table multiply, two FMAs) on the two ports that run
 * 512-bit work, so on a 2.1 GHz Xeon the Kimi MoE layer at one token read 17-19 GB/s of the
 * read probe's 25-29 (65%, 2 threads): compute-bound. Here 64 weights cost 8: widen the code
 * bytes to 16 bits, mask, shift, two vpdpwssd, convert, permute the scales, one FMA.
 *
 * Rounding: block b of a row, d = max|x| / 32767 and xq = x * (1/d) rounded half away from zero
 * (kimi_w4a8.c's steps at 16 bits). |x - d xq| <= d / 2 = max|x| / 65534: 2^-16 of the block's
 * largest value, where bfloat16 activations (a GPU's) are off by up to 2^-9 of each value.
 * Codes lie in the pair layout: per pair of blocks (j, j+1), [E_j E_j+1 | O_j O_j+1], 16 int16
 * each (E the even elements, which the low nibbles meet), so 32 code bytes widened to words
 * meet 32 contiguous x codes. Per weight row and x row:
 *     y = sum_pairs sum_lanes s_b d_b dot(q_b, xq_b) + sum_g m_g gsum_g,
 *     gsum_g = sum over the group's blocks of d_b sum(xq_b)   (symmetric rows: m_g = -8 s_g)
 * The dots are exact int32 (at most 4 * 15 * 32767 per lane). The 4-row kernel (one x row, a
 * decode token) and the n-row one (a segment of several routes) run the same operations per
 * (weight row, x row), so a token's result is the same bits whatever shares the call.
 *
 * Used when w4a8_simd runs AVX-512 VNNI (its cap and gemv_simd's also cap this) and both
 * projections have k % 64 == 0; otherwise moe_grouped_w4a16 keeps the float kernels. */
#include "kimi_moe.h"

#include <float.h>
#include <string.h>

#define I16_BLOCK 32

/* One row [k] -> its int16 codes in the pair layout, d [k/32] and gsum [k/group]. The loops
 * are plain so that the compiler vectorizes them (SSE2 at the baseline). */
static void quantize_row(const float *src, int64_t k, int64_t group, int16_t *q, float *d,
                         float *gsum)
{
    int64_t nb = k / I16_BLOCK, per_group = group / I16_BLOCK, b;
    for (b = 0; b < nb; b++) {
        const float *xb = src + b * I16_BLOCK;
        int16_t *even = q + (b / 2) * 64 + (b % 2) * 16, *odd = even + 32;
        int32_t bits[I16_BLOCK], c[I16_BLOCK], top = 0, total = 0;
        float amax, db, inv;
        int j;
        memcpy(bits, xb, sizeof bits); /* max |x| on the bits (a NaN above all) */
        for (j = 0; j < I16_BLOCK; j++) {
            int32_t a = bits[j] & 0x7fffffff;
            top = a > top ? a : top;
        }
        memcpy(&amax, &top, sizeof amax);
        db = amax / 32767.0f;
        if (!(db >= FLT_MIN)) db = 0.0f; /* also NaN: 1/d would overflow */
        inv = db > 0.0f ? 1.0f / db : 0.0f;
        for (j = 0; j < I16_BLOCK; j++) {
            float v = xb[j] * inv;
            int32_t t = (int32_t)v; /* truncation; v - t is exact, so the tie test is too */
            float frac = v - (float)t;
            t += (frac >= 0.5f) - (frac <= -0.5f);
            c[j] = t > 32767 ? 32767 : (t < -32767 ? -32767 : t);
        }
        for (j = 0; j < I16_BLOCK / 2; j++) {
            even[j] = (int16_t)c[2 * j];
            odd[j] = (int16_t)c[2 * j + 1];
        }
        for (j = 0; j < I16_BLOCK; j++) total += c[j];
        d[b] = db;
        if (b % per_group == 0) gsum[b / per_group] = 0.0f;
        gsum[b / per_group] += db * (float)total;
    }
}

/* Prepared rows: q [rows, k] int16 first (each row 64-byte aligned when base is: 2k bytes, k
 * % 64 == 0), then d [rows, k/32], gsum [rows, k/group]. */
static int64_t i16_floats(int64_t rows, int64_t k, int64_t group)
{
    if (k % (2 * I16_BLOCK) || group % I16_BLOCK) return -1;
    return rows * (k / 2) + rows * (k / I16_BLOCK) + rows * (k / group);
}

static KhMoeRows i16_at(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhMoeRows op = {.k = k, .group = group};
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
        quantize_row(src + r * op->k, op->k, op->group, x.q, x.d, x.gsum);
    }
}

#if KH_HAVE_X86_SIMD
#include <immintrin.h>
#ifdef KH_VNNI_EMULATE
#include "simde_vnni.h" /* tests/vnni_emulated.sh: SIMDe's instructions stand in */
#define I16_TARGET __attribute__((target("avx2,fma,f16c")))
/* SIMDe has no vpmovzxbw to 512 bits: two 256-bit ones, the same words */
#define _mm512_cvtepu8_epi16(v) _mm512_inserti64x4(                                           \
    _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(v))),                  \
    _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)), 1)
#else
#define I16_TARGET \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

/* Pair p of 8 blocks: which of the 8 products s_b d_b each int32 lane of its dots takes. */
static const int32_t pair_lanes[4][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7}};

/* s_b d_b for the `count` (even, <= 8) blocks from b0 on, the rest 0. */
static I16_TARGET inline __m256 block_sd(const KhRow *w, const float *d, int64_t b0, int count)
{
    float prod[8] = {0};
    int64_t per_group = w->group / I16_BLOCK;
    int j;
    if (per_group == 1 && count == 8)
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->scales + b0))),
                             _mm256_loadu_ps(d + b0));
    for (j = 0; j < count; j++) prod[j] = _cvtsh_ss(w->scales[(b0 + j) / per_group]) * d[b0 + j];
    return _mm256_loadu_ps(prod);
}

/* acc += pair p's dots times their products: the 32 code bytes at q widened to words, the low
 * nibbles against the even x codes, the high against the odd; block 2p in lanes 0-7. */
static I16_TARGET inline __m512 pair_fma(__m512 acc, __m256 sd, int p, const uint8_t *q,
                                         __m512i even, __m512i odd)
{
    __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)q));
    __m512i lo = _mm512_and_si512(words, _mm512_set1_epi16(0x0f));
    __m512i hi = _mm512_srli_epi16(words, 4);
    __m512i dots = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), lo, even),
                                       hi, odd);
    __m512 scale = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)pair_lanes[p]),
                                         _mm512_castps256_ps512(sd));
    return _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dots), acc);
}

/* The lane sum plus the min terms (AVX2's halves dot: present wherever this runs). */
static I16_TARGET inline float finish(__m512 acc, const KhRow *w, const float *gsum)
{
    int64_t groups = w->k / w->group;
    float mins = w->mins ? kh_halves_dot_avx2(w->mins, gsum, groups)
                         : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w->scales, gsum, groups));
    return _mm512_reduce_add_ps(acc) + mins;
}

#define I16_X(xq, b) _mm512_loadu_si512((const void *)((xq) + (b) * 32))

/* One x row against 4 weight rows (a decode token): each x pair loaded once for the 4. */
static I16_TARGET void rows4(const KhRow *w, const KhI16 *x, float *y)
{
    int64_t k = w[0].k, nb = k / I16_BLOCK, b0;
    /* two quads ahead: the 4 rows are consecutive, so 4k bytes on is 8 rows later (as
     * kh_q8_rows4 found for Kimi's long rows) */
    const int64_t ahead = 4 * k > KH_PREFETCH ? 4 * k : KH_PREFETCH;
    __m512 acc[4];
    int i, p;
    for (i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8;
        __m256 sd[4];
        for (i = 0; i < 4; i++) {
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + 64 + ahead), _MM_HINT_T0);
            sd[i] = block_sd(&w[i], x->d, b0, count);
        }
        for (p = 0; p < count / 2; p++) {
            __m512i even = I16_X(x->q, b0 + 2 * p), odd = I16_X(x->q + 32, b0 + 2 * p);
            for (i = 0; i < 4; i++)
                acc[i] = pair_fma(acc[i], sd[i], p, w[i].q + (b0 + 2 * p) * 16, even, odd);
        }
    }
    for (i = 0; i < 4; i++) y[i] = finish(acc[i], &w[i], x->gsum);
}

/* One weight row against `rows` x rows, each pair by rows4's operations. Inlined per row
 * count (below), so the accumulators live in registers. */
static I16_TARGET inline __attribute__((always_inline)) void rows_body(
    const KhRow *w, const KhI16 *x, int64_t rows, float *y, int64_t y_stride)
{
    int64_t k = w->k, nb = k / I16_BLOCK, groups = k / w->group, b0, r;
    __m512 acc[KH_MAX_ROWS];
    __m256 sd[KH_MAX_ROWS];
    int p;
    for (r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8;
        _mm_prefetch((const char *)(w->q + b0 * 16 + KH_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(w->q + b0 * 16 + 64 + KH_PREFETCH), _MM_HINT_T0);
        for (r = 0; r < rows; r++) sd[r] = block_sd(w, x->d + r * nb, b0, count);
        for (p = 0; p < count / 2; p++)
            for (r = 0; r < rows; r++) {
                const int16_t *xq = x->q + r * k;
                acc[r] = pair_fma(acc[r], sd[r], p, w->q + (b0 + 2 * p) * 16,
                                  I16_X(xq, b0 + 2 * p), I16_X(xq + 32, b0 + 2 * p));
            }
    }
    for (r = 0; r < rows; r++) y[r * y_stride] = finish(acc[r], w, x->gsum + r * groups);
}

#define I16_ROWS(ROWS)                                                                     \
    static I16_TARGET void rows_##ROWS(const KhRow *w, const KhI16 *x, float *y,           \
                                       int64_t y_stride)                                   \
    {                                                                                      \
        rows_body(w, x, ROWS, y, y_stride);                                                \
    }
I16_ROWS(1) I16_ROWS(2) I16_ROWS(3) I16_ROWS(4) I16_ROWS(5) I16_ROWS(6) I16_ROWS(7) I16_ROWS(8)
#undef I16_ROWS

static void i16_dots(const KhMoeRows *op, const KhRow *w, int count, int64_t r0, int64_t rows,
                     float *y, int64_t y_stride)
{
    static void (*const by_rows[KH_MAX_ROWS + 1])(const KhRow *, const KhI16 *, float *,
                                                  int64_t) = {
        0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6, rows_7, rows_8};
    KhI16 x = i16_from(op, r0);
    int t;
    if (rows == 1) { /* 4 weight rows per x load; a short count repeats the last */
        KhRow four[4];
        float y4[4];
        for (t = 0; t < 4; t++) four[t] = w[t < count ? t : count - 1];
        rows4(four, &x, y4);
        for (t = 0; t < count; t++) y[t] = y4[t];
        return;
    }
    for (t = 0; t < count; t++) by_rows[rows](&w[t], &x, y + t, y_stride);
}

#else
static void i16_dots(const KhMoeRows *op, const KhRow *w, int count, int64_t r0, int64_t rows,
                     float *y, int64_t y_stride)
{
    (void)op, (void)w, (void)count, (void)r0, (void)rows, (void)y, (void)y_stride;
}
#endif

int kh_moe_i16_runs(int64_t d, int64_t inner, int64_t group)
{
    return w4a8_simd(-1) == 3 && i16_floats(1, d, group) > 0 && i16_floats(1, inner, group) > 0;
}

const KhMoeDot kh_moe_i16 = {4, i16_floats, i16_at, i16_prepare, i16_dots};
