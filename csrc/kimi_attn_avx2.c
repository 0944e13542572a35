/* AVX2 + FMA + F16C chunk kernels of decode attention (kimi_attn.h's loop): the fp16 keys and
 * values are converted in registers as they are used, once for up to 3 query heads of the KV
 * group, instead of being stored to a float buffer first and loaded back once per head.
 *
 * Why: a key cost ~150 vector instructions per KV head, two thirds of them conversions, stores
 * and reloads around its 48 FMAs, so one-row attention ran at 1.2 us a cached token of
 * SmolLM2 (30 layers), 2.6x its memory's time. The arithmetic is the float kernels' own, in
 * the same order: per head and key one FMA chain over the dims 8 at a time, summed by the same
 * tree; per head and value element one chain over the keys in order. So every result is the
 * same bits as before. */
#include "kimi_attn.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>
#define KH_TARGET __attribute__((target("avx2,fma,f16c")))
#define HEADS KH_ATTN_PASS_HEADS /* 12 accumulators + 3 broadcasts + 1 row of 16 ymm */

static KH_TARGET inline __m256 half8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* score[h][j + u] for HB heads and the 4 keys from j: per (head, key) a chain over the dims,
 * then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of its lanes (hadd, hadd, then the
 * two 128-bit halves), times scale. */
static KH_TARGET inline __attribute__((always_inline)) void score4(
    const float *q, const uint16_t *k, int64_t stride, int64_t hd, int hb, float scale,
    float (*score)[KH_ATTN_CHUNK], int64_t j)
{
    __m256 a[HEADS][4], qv[HEADS];
    int64_t i;
    int h, u;
    for (h = 0; h < hb; h++)
        for (u = 0; u < 4; u++) a[h][u] = _mm256_setzero_ps();
    for (i = 0; i < hd; i += 8) {
        for (h = 0; h < hb; h++) qv[h] = _mm256_loadu_ps(q + h * hd + i);
        for (u = 0; u < 4; u++) {
            __m256 kv = half8(k + (j + u) * stride + i);
            for (h = 0; h < hb; h++) a[h][u] = _mm256_fmadd_ps(qv[h], kv, a[h][u]);
        }
    }
    for (h = 0; h < hb; h++) {
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[h][0], a[h][1]), _mm256_hadd_ps(a[h][2], a[h][3]));
        __m128 sum = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        _mm_storeu_ps(score[h] + j, _mm_mul_ps(_mm_set1_ps(scale), sum));
    }
}

/* A key past the last whole 8: two chains (even and odd 8-lane steps), as the float kernel's
 * per-key dot. */
static KH_TARGET inline float dot1(const float *q, const uint16_t *k, int64_t n)
{
    __m256 acc = _mm256_setzero_ps(), acc_odd = _mm256_setzero_ps();
    int64_t i;
    for (i = 0; i + 16 <= n; i += 16) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), half8(k + i), acc);
        acc_odd = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), half8(k + i + 8), acc_odd);
    }
    if (i < n) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), half8(k + i), acc);
    return hsum256(_mm256_add_ps(acc, acc_odd));
}

/* `ahead`'s rows are prefetched by the first pass over the keys (NULL on the others). */
static KH_TARGET inline __attribute__((always_inline)) void score_heads(
    const float *q, const uint16_t *k, int64_t stride, int64_t count, int64_t hd, int hb,
    float scale, float (*score)[KH_ATTN_CHUNK], const uint16_t *ahead)
{
    int64_t j;
    int h, u;
    for (j = 0; j + 8 <= count; j += 8) { /* 8 keys as the float kernel's blocks were */
        for (u = 0; u < 8; u++) kh_attn_prefetch(ahead, j + u, stride, hd);
        score4(q, k, stride, hd, hb, scale, score, j);
        score4(q, k, stride, hd, hb, scale, score, j + 4);
    }
    for (; j < count; j++) {
        kh_attn_prefetch(ahead, j, stride, hd);
        for (h = 0; h < hb; h++) score[h][j] = dot1(q + h * hd, k + j * stride, hd) * scale;
    }
}

/* acc[h][i0 ..] += sum_j score[h][j] * value j [i0 ..] for HB heads and LANES x 8 elements
 * held in registers across the keys: each element's chain takes the keys in order. */
static KH_TARGET inline __attribute__((always_inline)) void accumulate_lanes(
    float (*acc)[KH_ATTN_MAX_DIM], float (*score)[KH_ATTN_CHUNK], const uint16_t *v,
    int64_t stride, int64_t count, int64_t hd, int hb, int lanes, int64_t i0,
    const uint16_t *ahead)
{
    __m256 y[HEADS][4], w[HEADS];
    int64_t j;
    int h, u;
    for (h = 0; h < hb; h++)
        for (u = 0; u < lanes; u++) y[h][u] = _mm256_loadu_ps(acc[h] + i0 + 8 * u);
    for (j = 0; j < count; j++) {
        kh_attn_prefetch(ahead, j, stride, hd);
        for (h = 0; h < hb; h++) w[h] = _mm256_set1_ps(score[h][j]);
        for (u = 0; u < lanes; u++) {
            __m256 vv = half8(v + j * stride + i0 + 8 * u);
            for (h = 0; h < hb; h++) y[h][u] = _mm256_fmadd_ps(w[h], vv, y[h][u]);
        }
    }
    for (h = 0; h < hb; h++)
        for (u = 0; u < lanes; u++) _mm256_storeu_ps(acc[h] + i0 + 8 * u, y[h][u]);
}

KH_ATTN_PASSES(accumulate_chunk_avx2, 8, HEADS) /* 32 elements a pass */

KH_TARGET void kh_attn_score_chunk_avx2(const float *q, const uint16_t *k, int64_t stride,
                                        int64_t count, int64_t hd, int64_t group, float scale,
                                        float (*score)[KH_ATTN_CHUNK], float *kv_f,
                                        const uint16_t *ahead)
{
    (void)kv_f;
    score_groups(q, k, stride, count, hd, group, scale, score, ahead);
}

/* exp_sum from 8-lane group j on (sum: the groups before it, lane by lane): the groups, the
 * lanes' sum, then the last n % 8 one at a time. */
KH_TARGET float kh_attn_exp_sum_tail(float *s, int64_t n, float m, int64_t j, __m256 sum)
{
    __m256 mv = _mm256_set1_ps(m);
    float total;
    for (; j + 8 <= n; j += 8) {
        __m256 v = kh_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, v);
        sum = _mm256_add_ps(sum, v);
    }
    total = hsum256(sum);
    for (; j < n; j++) {
        s[j] = expf(s[j] - m);
        total += s[j];
    }
    return total;
}

KH_TARGET float kh_attn_exp_sum_avx2(float *s, int64_t n, float m)
{
    return kh_attn_exp_sum_tail(s, n, m, 0, _mm256_setzero_ps());
}

/* kh_attn_max's 8 chains, lane l of one register each: vmaxps(s, m) is `s > m ? s : m`, lane
 * by lane, NaNs and zeros included; then its own rest (kh_attn_max_rest). */
KH_TARGET float kh_attn_max_avx2(const float *s, int64_t n, float m)
{
    __m256 chains = _mm256_set1_ps(m);
    float part[8];
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) chains = _mm256_max_ps(_mm256_loadu_ps(s + j), chains);
    _mm256_storeu_ps(part, chains);
    return kh_attn_max_rest(s, j, n, part);
}

KH_TARGET void kh_attend_range_avx2(void *ctx, int64_t task)
{
    kh_attend_range(ctx, task, kh_attn_score_chunk_avx2, accumulate_chunk_avx2, kh_attn_max_avx2,
                    kh_attn_exp_sum_avx2);
}

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
