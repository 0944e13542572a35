/* AVX2 W4A8 kernel (group % 32 == 0), compiled for AVX2/FMA/F16C by function attribute and
 * chosen at run time. Per block of 32 weights: 16 code bytes become one vector of 32
 * unsigned codes (low nibbles, then high ones: the order of the de-interleaved x codes),
 * maddubs multiplies them by the 32 signed x codes into 16 int16 pair sums (at most
 * 2 * 15 * 127, no saturation), madd by ones gives 8 int32, and one FMA adds them times
 * s_g * d_b. Memory traffic: 16 code bytes + 2 or 4 bytes of scale/min per 32 weights,
 * read once for all rows; x is 1 byte per element (plus 4 per block) and stays in L1. */
#include "kimi_simd.h"

#if KH_HAVE_X86_SIMD
#include <float.h>
#include <immintrin.h>
#include <string.h>

#define KH_TARGET __attribute__((target("avx2,fma,f16c")))

/* The shared integer-dot kernels (kh_q8_rows4_avx2, kh_q8_pairs_avx2, kh_q8q8_row_avx2,
 * block_scales_avx2): maddubs gives int16 pair sums, madd by ones the int32 lanes. */
#define KH_I8_FN(name) name##_avx2
#define KH_I8_TARGET KH_TARGET
#define KH_I8_WIDE 0
#define KH_I8_DOT4(lo, hi, even, odd) _mm256_madd_epi16(_mm256_add_epi16(                 \
    _mm256_maddubs_epi16(lo, even), _mm256_maddubs_epi16(hi, odd)), _mm256_set1_epi16(1))
#define KH_I8_SDOT(w, x) _mm256_madd_epi16(                                                \
    _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1))
#include "kimi_int8_body.h"

/* acc[r] += sd[r][J] * dot(codes of block BLK, x row r block BLK) for every row r. */
#define KH_Q8_STEP(ROWS, BLK, J, ACC)                                                      \
    do {                                                                                   \
        __m128i raw = _mm_loadu_si128((const __m128i *)(w->q + (BLK) * 16));               \
        __m256i codes = _mm256_and_si256(_mm256_inserti128_si256(                          \
            _mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1), mask);                \
        for (r = 0; r < ROWS; r++) {                                                       \
            __m256i xq = _mm256_loadu_si256((const __m256i *)(x->q + r * w->k + (BLK) * 32)); \
            __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xq), ones);        \
            ACC[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[r][J]),                       \
                                     _mm256_cvtepi32_ps(dot), ACC[r]);                     \
        }                                                                                  \
    } while (0)

/* ROWS is a constant in each instance, so the row loops unroll; a second accumulator set
 * breaks the FMA chain. Every instance takes the same operations per row (at 8 rows some
 * accumulators spill), so a row's result does not depend on its batch. Blocks go 8 at a
 * time: their s_g * d_rb products are formed in one vector multiply per row. This kernel
 * serves k % 64 == 32; other shapes take the paired ones. */
#define KH_Q8_ROW_KERNEL(ROWS)                                                             \
    static KH_TARGET void q8_##ROWS(const KhRow *w, const KhQ8 *x, float *y,               \
                                    int64_t y_stride)                                      \
    {                                                                                      \
        const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);          \
        int64_t groups = w->k / w->group, nb = w->k / 32, b0;                              \
        __m256 acc0[ROWS], acc1[ROWS];                                                     \
        float sblk[8], sd[ROWS][8];                                                        \
        int r, j;                                                                          \
        for (r = 0; r < ROWS; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();                \
        for (b0 = 0; b0 < nb; b0 += 8) {                                                   \
            int count = nb - b0 < 8 ? (int)(nb - b0) : 8;                                  \
            _mm_prefetch((const char *)(w->q + b0 * 16 + KH_PREFETCH), _MM_HINT_T0);       \
            _mm_prefetch((const char *)(w->q + b0 * 16 + 64 + KH_PREFETCH), _MM_HINT_T0);  \
            block_scales_avx2(w, b0, count, sblk);                                              \
            for (r = 0; r < ROWS; r++) {                                                   \
                const float *d = x->d + r * nb + b0;                                       \
                if (count == 8)                                                            \
                    _mm256_storeu_ps(sd[r], _mm256_mul_ps(_mm256_loadu_ps(sblk),           \
                                                          _mm256_loadu_ps(d)));            \
                else                                                                       \
                    for (j = 0; j < count; j++) sd[r][j] = sblk[j] * d[j];                 \
            }                                                                              \
            for (j = 0; j + 1 < count; j += 2) {                                           \
                KH_Q8_STEP(ROWS, b0 + j, j, acc0);                                         \
                KH_Q8_STEP(ROWS, b0 + j + 1, j + 1, acc1);                                 \
            }                                                                              \
            if (j < count) KH_Q8_STEP(ROWS, b0 + j, j, acc0);                              \
        }                                                                                  \
        for (r = 0; r < ROWS; r++) {                                                       \
            const float *gs = x->gsum + r * groups; /* symmetric: min = -8 s */            \
            float mins = w->mins ? kh_halves_dot_avx2(w->mins, gs, groups)                         \
                                 : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w->scales, gs, groups));    \
            y[r * y_stride] = hsum256(_mm256_add_ps(acc0[r], acc1[r])) + mins;             \
        }                                                                                  \
    }

KH_FOR_ROWS(KH_Q8_ROW_KERNEL)

typedef void (*RowQ8)(const KhRow *, const KhQ8 *, float *, int64_t);
static const RowQ8 by_rows[KH_MAX_ROWS + 1] = KH_BY_ROWS(q8);

void kh_q8_row_avx2(const KhRow *w, const KhQ8 *x, int64_t rows, float *y, int64_t y_stride)
{
    by_rows[rows](w, x, y, y_stride);
}

/* The largest |x| of a block of 32 as its bits (kimi_simd.h). */
KH_TARGET int32_t kh_block_top_avx2(const float *src)
{
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    __m256i top = _mm256_setzero_si256();
    __m128i t;
    int j;
    for (j = 0; j < 4; j++)
        top = _mm256_max_epi32(top, _mm256_and_si256(
                                        _mm256_loadu_si256((const __m256i *)(src + 8 * j)),
                                        magnitude));
    t = _mm_max_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
    t = _mm_max_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_max_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    return _mm_cvtsi128_si32(t);
}

/* kimi_w4a8.c's quantize_block on 8 lanes (kh_quantize_q8 takes it where AVX2 is there): the
 * same operations on the same values (max of |x|'s bits, d = amax / 127, x * (1/d) truncated
 * (0 where that is NaN: an inf in a block makes d inf and inv 0, and inf * 0 is NaN, which
 * cvtt would turn into INT_MIN and the clamp into -127), a half rounded away from zero,
 * clamped to +-127), so the same codes, d and sum; the codes packed in order, or
 * de-interleaved (evens, then odds). The plain loops, vectorized by the compiler, took ~28 ns
 * a block. */
KH_TARGET float kh_quantize_block_avx2(const float *src, int8_t *dst, int32_t *sum,
                                       int deinterleave)
{
    const __m256 half = _mm256_set1_ps(0.5f), minus_half = _mm256_set1_ps(-0.5f);
    __m256i bits[4], q[4], total = _mm256_setzero_si256(), bytes;
    __m128i t;
    float amax, d, inv;
    int32_t top_bits;
    __m256 scale;
    int j;
    for (j = 0; j < 4; j++) bits[j] = _mm256_loadu_si256((const __m256i *)(src + 8 * j));
    top_bits = kh_block_top_avx2(src);
    memcpy(&amax, &top_bits, sizeof amax);
    d = amax / 127.0f;
    if (!(d >= FLT_MIN)) d = 0.0f; /* also NaN */
    inv = d > 0.0f ? 1.0f / d : 0.0f;
    scale = _mm256_set1_ps(inv);
    for (j = 0; j < 4; j++) {
        __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(bits[j]), scale);
        __m256i i;
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> 0 */
        i = _mm256_cvttps_epi32(v);
        __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(i));
        i = _mm256_sub_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, half, _CMP_GE_OQ)));
        i = _mm256_add_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, minus_half, _CMP_LE_OQ)));
        q[j] = _mm256_min_epi32(_mm256_max_epi32(i, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
        total = _mm256_add_epi32(total, q[j]);
    }
    /* per 128-bit lane the packs give dwords q0[0..3] q1[0..3] q2[0..3] q3[0..3], then the
     * same for elements 4..7: the permute puts the 8 dwords back in element order */
    bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if (deinterleave) { /* per lane evens then odds, then the two lanes' evens first */
        const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                               0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, split), 0xd8);
    }
    _mm256_storeu_si256((__m256i *)dst, bytes);
    t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    *sum = _mm_cvtsi128_si32(t);
    return d;
}

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
