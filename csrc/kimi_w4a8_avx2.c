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

/* The scale s_g of each of the `count` (<= 8) blocks from b0 on, as floats. */
static KH_TARGET void block_scales(const KhRow *w, int64_t b0, int count, float *out)
{
    int64_t per_group = w->group / 32;
    int j;
    if (per_group == 1 && count == 8) {
        _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->scales + b0))));
        return;
    }
    for (j = 0; j < count; j++) out[j] = _cvtsh_ss(w->scales[(b0 + j) / per_group]);
}

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

/* ROWS is a constant in each instance, so the row loops unroll and the accumulators live
 * in registers; up to 4 rows, a second accumulator set breaks the FMA chain. Blocks go
 * 8 at a time: their s_g * d_rb products are formed in one vector multiply per row. */
#define KH_Q8_ROW_KERNEL(ROWS)                                                             \
    static KH_TARGET void q8_avx2_##ROWS(const KhRow *w, const KhQ8 *x, float *y,          \
                                         int64_t y_stride)                                 \
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
            block_scales(w, b0, count, sblk);                                              \
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
                if (ROWS <= 4) KH_Q8_STEP(ROWS, b0 + j + 1, j + 1, acc1);                  \
                else KH_Q8_STEP(ROWS, b0 + j + 1, j + 1, acc0);                            \
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

KH_Q8_ROW_KERNEL(1)
KH_Q8_ROW_KERNEL(2)
KH_Q8_ROW_KERNEL(3)
KH_Q8_ROW_KERNEL(4)
KH_Q8_ROW_KERNEL(5)
KH_Q8_ROW_KERNEL(6)
KH_Q8_ROW_KERNEL(7)
KH_Q8_ROW_KERNEL(8)

/* One x row against 4 weight rows at once (decode at B = 1), two blocks per step: 32 code
 * bytes (blocks j, j+1) give the even elements of both by one mask and the odd ones by one
 * shift, and x comes in the matching pair layout (kh_pair_q8: [E_j E_j+1 | O_j O_j+1]).
 * Both maddubs sums fit int16 (2 * 2 * 15 * 127), one madd gives block j in lanes 0-3 and
 * j+1 in 4-7, and one FMA scales them by [s_j d_j x4 | s_j+1 d_j+1 x4]. Each x pair is loaded
 * once for the 4 rows, whose accumulators are independent FMA chains. k % 64 == 0; rows of
 * one linear share k and group, and mins are NULL for all or none. */
KH_TARGET void kh_q8_rows4_avx2(const KhRow *w, const KhQ8 *x, float *y)
{
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    int64_t k = w[0].k, groups = k / w[0].group, nb = k / 32, b0;
    int block_groups = w[0].group == 32; /* a scale and min per block: the mins join the loop */
    __m256 acc[4], acc_min[4];
    __m128 sums;
    float tail_min[4] = {0};
    int i, p, j;
    for (i = 0; i < 4; i++) acc[i] = acc_min[i] = _mm256_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8; /* even: nb is */
        __m256 sd[4];
        for (i = 0; i < 4; i++) {
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + KH_PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + 64 + KH_PREFETCH), _MM_HINT_T0);
            if (block_groups && count == 8) {
                __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w[i].scales + b0)));
                __m256 m = w[i].mins
                    ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w[i].mins + b0)))
                    : _mm256_mul_ps(s, _mm256_set1_ps(-8.0f)); /* symmetric */
                sd[i] = _mm256_mul_ps(s, _mm256_loadu_ps(x->d + b0));
                acc_min[i] = _mm256_fmadd_ps(m, _mm256_loadu_ps(x->gsum + b0), acc_min[i]);
            } else {
                float sblk[8] = {0}, prod[8] = {0};
                block_scales(&w[i], b0, count, sblk);
                for (j = 0; j < count; j++) prod[j] = sblk[j] * x->d[b0 + j];
                sd[i] = _mm256_loadu_ps(prod);
                if (block_groups)
                    for (j = 0; j < count; j++)
                        tail_min[i] += (w[i].mins ? _cvtsh_ss(w[i].mins[b0 + j]) : -8.0f * sblk[j])
                                       * x->gsum[b0 + j];
            }
        }
        for (p = 0; p < count / 2; p++) {
            const int8_t *xp = x->q + (b0 + 2 * p) * 32;
            __m256i even = _mm256_loadu_si256((const __m256i *)xp);
            __m256i odd = _mm256_loadu_si256((const __m256i *)(xp + 32));
            __m256i lanes = _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1,
                                              2 * p + 1, 2 * p + 1);
            for (i = 0; i < 4; i++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(w[i].q + (b0 + 2 * p) * 16));
                __m256i lo = _mm256_and_si256(raw, mask);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, even),
                                                 _mm256_maddubs_epi16(hi, odd));
                __m256i dot = _mm256_madd_epi16(pairs, ones);
                acc[i] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sd[i], lanes),
                                         _mm256_cvtepi32_ps(dot), acc[i]);
            }
        }
    }
    { /* the 4 rows' lane sums at once: [A B C D] */
        __m256 ab = _mm256_hadd_ps(_mm256_add_ps(acc[0], acc_min[0]), _mm256_add_ps(acc[1], acc_min[1]));
        __m256 cd = _mm256_hadd_ps(_mm256_add_ps(acc[2], acc_min[2]), _mm256_add_ps(acc[3], acc_min[3]));
        __m256 all = _mm256_hadd_ps(ab, cd);
        sums = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
    }
    _mm_storeu_ps(y, _mm_add_ps(sums, _mm_loadu_ps(tail_min)));
    if (block_groups) return;
    for (i = 0; i < 4; i++) /* groups of several blocks: the min terms per group */
        y[i] += w[i].mins ? kh_halves_dot_avx2(w[i].mins, x->gsum, groups)
                          : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w[i].scales, x->gsum, groups));
}

/* One weight row against `rows` (1..KH_MAX_ROWS) x rows in the pair layout, each (weight row,
 * x row) by exactly the operations of kh_q8_rows4_avx2 (the same lanes, FMA order, tail and
 * reduction), so a decode row's result is the same bits alone or in a batch. */
KH_TARGET void kh_q8_pairs_avx2(const KhRow *w, const KhQ8 *x, int64_t rows, float *y,
                                int64_t y_stride)
{
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    int64_t k = w->k, groups = k / w->group, nb = k / 32, b0, r;
    int block_groups = w->group == 32;
    __m256 acc[KH_MAX_ROWS], acc_min[KH_MAX_ROWS], sd[KH_MAX_ROWS];
    float tail_min[KH_MAX_ROWS] = {0};
    int p, j;
    for (r = 0; r < rows; r++) acc[r] = acc_min[r] = _mm256_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8;
        _mm_prefetch((const char *)(w->q + b0 * 16 + KH_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(w->q + b0 * 16 + 64 + KH_PREFETCH), _MM_HINT_T0);
        if (block_groups && count == 8) {
            __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->scales + b0)));
            __m256 m = w->mins ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->mins + b0)))
                               : _mm256_mul_ps(sv, _mm256_set1_ps(-8.0f));
            for (r = 0; r < rows; r++) {
                sd[r] = _mm256_mul_ps(sv, _mm256_loadu_ps(x->d + r * nb + b0));
                acc_min[r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(x->gsum + r * groups + b0),
                                             acc_min[r]);
            }
        } else {
            float sblk[8] = {0};
            block_scales(w, b0, count, sblk);
            for (r = 0; r < rows; r++) {
                float prod[8] = {0};
                for (j = 0; j < count; j++) prod[j] = sblk[j] * x->d[r * nb + b0 + j];
                sd[r] = _mm256_loadu_ps(prod);
                if (block_groups)
                    for (j = 0; j < count; j++)
                        tail_min[r] += (w->mins ? _cvtsh_ss(w->mins[b0 + j]) : -8.0f * sblk[j])
                                       * x->gsum[r * groups + b0 + j];
            }
        }
        for (p = 0; p < count / 2; p++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(w->q + (b0 + 2 * p) * 16));
            __m256i lo = _mm256_and_si256(raw, mask);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            __m256i lanes = _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1,
                                              2 * p + 1, 2 * p + 1);
            for (r = 0; r < rows; r++) {
                const int8_t *xp = x->q + r * k + (b0 + 2 * p) * 32;
                __m256i pairs = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xp)),
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xp + 32))));
                __m256i dot = _mm256_madd_epi16(pairs, ones);
                acc[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sd[r], lanes),
                                         _mm256_cvtepi32_ps(dot), acc[r]);
            }
        }
    }
    for (r = 0; r < rows; r++) { /* kh_q8_rows4_avx2's hadd tree, for one row */
        __m256 a = _mm256_add_ps(acc[r], acc_min[r]);
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, a), _mm256_hadd_ps(a, a));
        float sum = _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
        float out = sum + tail_min[r];
        if (!block_groups)
            out += w->mins ? kh_halves_dot_avx2(w->mins, x->gsum + r * groups, groups)
                           : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w->scales, x->gsum + r * groups, groups));
        y[r * y_stride] = out;
    }
}

typedef void (*RowQ8)(const KhRow *, const KhQ8 *, float *, int64_t);
static const RowQ8 by_rows[KH_MAX_ROWS + 1] = {
    0, q8_avx2_1, q8_avx2_2, q8_avx2_3, q8_avx2_4, q8_avx2_5, q8_avx2_6, q8_avx2_7, q8_avx2_8};

void kh_q8_row_avx2(const KhRow *w, const KhQ8 *x, int64_t rows, float *y, int64_t y_stride)
{
    by_rows[rows](w, x, y, y_stride);
}

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
