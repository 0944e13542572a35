/* AVX-512 chunk kernels of decode attention (kimi_attn.h's loop), for head_dim % 16 == 0:
 * the AVX2 kernels' operations (kimi_attn_avx2.c), each lane as there, half the instructions.
 *
 * Why: in a verify step of 8 rows (speculative decoding) at ~300 cached tokens, attention
 * was a fifth of SmolLM2's step on the Intel CI kind, whose two 512-bit FMA ports the AVX2
 * kernels used at half width.
 *
 * Scores: a 512-bit register holds two keys' 8-lane chains (key j low, key j + 1 high), each
 * lane the AVX2 kernel's chain over the dims 8 at a time, the query's 8 dims broadcast to both
 * halves; then the AVX2 kernel's sum tree, each add on the same pair of values, by lane
 * permutes (pair_sums). Keys past the last whole 8 go to the AVX2 kernel itself. Values: 16
 * elements a register, each element's chain over the keys in order, as the AVX2 kernel's 8.
 * The exp-sums are the AVX2 kernel's. So every result is the AVX2 kernels' bits
 * (tests/ops/test_llama_layer.py holds them to it). */
#include "kimi_attn.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>
#define KH_TARGET __attribute__((target("avx2,fma,f16c,avx512f")))
#define HEADS KH_ATTN_PASS_HEADS_512 /* 24 accumulators + 6 queries + 1 key pair */

/* Keys j (low half) and j + 1 (high half), dims i..i+7 of each, as floats. */
static KH_TARGET inline __m512 key_pair(const uint16_t *k, int64_t stride)
{
    __m128i lo = _mm_loadu_si128((const __m128i *)k);
    __m128i hi = _mm_loadu_si128((const __m128i *)(k + stride));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* 8 floats at p in both halves (AVX-512F: no DQ broadcast needed). */
static KH_TARGET inline __m512 both_halves(const float *p)
{
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

static KH_TARGET inline __m256 high_half(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* Lane i of the result: lanes 2i and 2i + 1 of a then b (as 32 lanes) added, even + odd. */
static KH_TARGET inline __m512 pair_sums(__m512 a, __m512 b)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    return _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
}

/* One head's 8 keys' chains (a[p]: key 2p's 8 lanes low, key 2p + 1's high) -> lanes 2u and
 * 2u + 1: key u's ((l0 + l1) + (l2 + l3)) and ((l4 + l5) + (l6 + l7)), the AVX2 sum tree's
 * first two rounds (its hadds); pair_sums of two such registers is its last. */
static KH_TARGET inline __m512 score_tree(const __m512 *a)
{
    return pair_sums(pair_sums(a[0], a[1]), pair_sums(a[2], a[3]));
}

/* score[h][j + u] for HB heads and the 8 keys from j (kimi_attn_avx2.c's score4, twice): the
 * sums in the AVX2 tree's order by lane permutes, two heads a register, where 256-bit hadds
 * took as many instructions as the FMAs (score8 was twice the accumulate kernel's time). */
static KH_TARGET inline __attribute__((always_inline)) void score8(
    const float *q, const uint16_t *k, int64_t stride, int64_t hd, int hb, float scale,
    float (*score)[KH_ATTN_CHUNK], int64_t j)
{
    __m512 a[HEADS][4], qv[HEADS];
    int64_t i;
    int h, p;
    for (h = 0; h < hb; h++)
        for (p = 0; p < 4; p++) a[h][p] = _mm512_setzero_ps();
    for (i = 0; i < hd; i += 8) {
        for (h = 0; h < hb; h++) qv[h] = both_halves(q + h * hd + i);
        for (p = 0; p < 4; p++) {
            __m512 kv = key_pair(k + (j + 2 * p) * stride + i, stride);
            for (h = 0; h < hb; h++) a[h][p] = _mm512_fmadd_ps(qv[h], kv, a[h][p]);
        }
    }
    for (h = 0; h < hb; h += 2) { /* two heads' 8 keys in one register: low half h, high h + 1 */
        __m512 sum = pair_sums(score_tree(a[h]), score_tree(a[h + 1 < hb ? h + 1 : h]));
        sum = _mm512_mul_ps(_mm512_set1_ps(scale), sum);
        _mm256_storeu_ps(score[h] + j, _mm512_castps512_ps256(sum));
        if (h + 1 < hb) _mm256_storeu_ps(score[h + 1] + j, high_half(sum));
    }
}

static KH_TARGET inline __attribute__((always_inline)) void score_heads(
    const float *q, const uint16_t *k, int64_t stride, int64_t count, int64_t hd, int hb,
    float scale, float (*score)[KH_ATTN_CHUNK], const uint16_t *ahead)
{
    int64_t j;
    int u;
    for (j = 0; j + 8 <= count; j += 8) {
        for (u = 0; u < 8; u++) kh_attn_prefetch(ahead, j + u, stride, hd);
        score8(q, k, stride, hd, hb, scale, score, j);
    }
}

/* acc[h][i0 ..] += sum_j score[h][j] * value j [i0 ..] for HB heads and LANES x 16 elements. */
static KH_TARGET inline __attribute__((always_inline)) void accumulate_lanes(
    float (*acc)[KH_ATTN_MAX_DIM], float (*score)[KH_ATTN_CHUNK], const uint16_t *v,
    int64_t stride, int64_t count, int64_t hd, int hb, int lanes, int64_t i0,
    const uint16_t *ahead)
{
    __m512 y[HEADS][4], w[HEADS];
    int64_t j;
    int h, u;
    for (h = 0; h < hb; h++)
        for (u = 0; u < lanes; u++) y[h][u] = _mm512_loadu_ps(acc[h] + i0 + 16 * u);
    for (j = 0; j < count; j++) {
        kh_attn_prefetch(ahead, j, stride, hd);
        for (h = 0; h < hb; h++) w[h] = _mm512_set1_ps(score[h][j]);
        for (u = 0; u < lanes; u++) {
            const uint16_t *vp = v + j * stride + i0 + 16 * u;
            __m512 vv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)vp));
            for (h = 0; h < hb; h++) y[h][u] = _mm512_fmadd_ps(w[h], vv, y[h][u]);
        }
    }
    for (h = 0; h < hb; h++)
        for (u = 0; u < lanes; u++) _mm512_storeu_ps(acc[h] + i0 + 16 * u, y[h][u]);
}

KH_ATTN_PASSES(accumulate_chunk_avx512, 16, HEADS) /* 64 elements a pass */

static KH_TARGET void score_chunk_avx512(const float *q, const uint16_t *k, int64_t stride,
                                         int64_t count, int64_t hd, int64_t group, float scale,
                                         float (*score)[KH_ATTN_CHUNK], float *kv_f,
                                         const uint16_t *ahead)
{
    int64_t whole = count / 8 * 8;
    score_groups(q, k, stride, whole, hd, group, scale, score, ahead);
    if (whole < count) /* the last keys: the AVX2 kernel's per-key dots, into the same rows */
        kh_attn_score_chunk_avx2(q, k + whole * stride, stride, count - whole, hd, group, scale,
                                 (float (*)[KH_ATTN_CHUNK])(score[0] + whole), kv_f,
                                 ahead ? ahead + whole * stride : NULL);
}

/* kh_exp256 (kimi_simd.h) on 16 lanes: its text, each lane its bits. */
KH_EXP_FN(exp16, KH_TARGET, __m512, __m512i, _mm512_, _mm512_roundscale_ps, _mm512_castsi512_ps)

/* kh_attn_exp_sum_avx2's bits: the exps 16 at a time, each 8 added to the one 8-lane sum in
 * order (its chain per lane), the rest as there. The exps were a sixth of attention's time. */
static KH_TARGET float exp_sum_avx512(float *s, int64_t n, float m)
{
    __m512 mv = _mm512_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
        _mm512_storeu_ps(s + j, v);
        sum = _mm256_add_ps(_mm256_add_ps(sum, _mm512_castps512_ps256(v)), high_half(v));
    }
    return kh_attn_exp_sum_tail(s, n, m, j, sum);
}

KH_TARGET void kh_attend_range_avx512(void *ctx, int64_t task)
{
    kh_attend_range(ctx, task, score_chunk_avx512, accumulate_chunk_avx512, kh_attn_max_avx2,
                    exp_sum_avx512);
}

/* merge_c's operations, 16 elements a register, the output in registers across the ranges
 * (each element the chain 0 + w_0 acc_0 + w_1 acc_1 + ..., then / total, as there). */
KH_TARGET void kh_attn_merge_avx512(const float *p, int64_t splits, int64_t stride, int64_t hd,
                                    float *out)
{
    __m512 y[KH_ATTN_MAX_DIM / 16];
    float top = -INFINITY, total = 0.0f;
    int64_t s, u, lanes = hd / 16;
    for (s = 0; s < splits; s++) top = p[s * stride] > top ? p[s * stride] : top;
    for (u = 0; u < lanes; u++) y[u] = _mm512_setzero_ps();
    for (s = 0; s < splits; s++) {
        const float *part = p + s * stride;
        float w = expf(part[0] - top);
        __m512 wv = _mm512_set1_ps(w);
        total += w * part[1];
        for (u = 0; u < lanes; u++)
            y[u] = _mm512_add_ps(y[u], _mm512_mul_ps(wv, _mm512_loadu_ps(part + 2 + 16 * u)));
    }
    for (u = 0; u < lanes; u++)
        _mm512_storeu_ps(out + 16 * u, _mm512_div_ps(y[u], _mm512_set1_ps(total)));
}

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
