/* AVX2 W4A8 kernel (group % 32 == 0), compiled for AVX2/FMA/F16C by function attribute and
 * chosen at run time. Per block of 32 weights: 16 code bytes become one vector of 32
 * unsigned codes (low nibbles, then high ones: the order of the de-interleaved x codes),
 * maddubs multiplies them by the 32 signed x codes into 16 int16 pair sums (at most
 * 2 * 15 * 127, no saturation), madd by ones gives 8 int32, and one FMA adds them times
 * s_g * d_b. Memory traffic: 16 code bytes + 2 or 4 bytes of scale/min per 32 weights,
 * read once for all rows; x is 1 byte per element (plus 4 per block) and stays in L1. */
#include "kimi_simd.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

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

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
