/* The W4A16 int16-dot kernels for AVX2 (and AVX-VNNI) CPUs: kimi_moe_i16.c says what they
 * compute. Chosen at run time by kh_moe_i16_pick; the AVX-512 VNNI set is kimi_i16_simd.c.
 *
 * Why a set of its own: on an AVX2-only EPYC (Zen 1, family 23) every 256-bit op is two
 * 128-bit ones, and vpmaddwd runs on one pipe only. The AVX-512 set's shape, a convert and an
 * FMA per block with the block's scale broadcast, spent 9.8 cycles a block (4.2 GB/s on one
 * core, a Kimi MoE layer at 38% of the read probe); the dots alone take about 5. Here the
 * float work is once per 8 blocks:
 *   - 32 code bytes (blocks 2p, 2p+1, one per 128-bit half) give four planes of 16 words
 *     with no widening: plane t holds element 4j+t of each block (j < 8), so the x codes lie
 *     in that order (the planes layout, kh_i16_planes_at), and each half's four vpmaddwd sum
 *     into block 2p's or 2p+1's lanes;
 *   - 8 blocks' four vectors reduce by unpacks and adds to one vector of the 8 blocks' exact
 *     int32 dots, in lanes [0 2 4 6 | 1 3 5 7];
 *   - the scales and d, in that lane order, meet it in one convert and one FMA.
 * 6.9 cycles a block on the same core (6.1 GB/s).
 *
 * A row's dot is one function (dot_row), which the 4-row kernel runs for each of its weight
 * rows and the n-row kernel for each of its x rows: a token's bits do not depend on the batch.
 * The dots are exact; the float sums run in another order than the AVX-512 set's, so the two
 * sets' results differ in the last bits. */
#include "kimi_moe.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* The int32 lanes of blocks (b, b+1) from their 32 code bytes at q and x codes at xq (the
 * planes layout): low half block b's partial dots, high half block b+1's. */
static TARGET inline __m256i pair_dots(const uint8_t *q, const int16_t *xq)
{
    const __m256i nibble = _mm256_set1_epi16(0x0f);
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    __m256i p0 = _mm256_and_si256(v, nibble);
    __m256i p1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    __m256i p2 = _mm256_and_si256(_mm256_srli_epi16(v, 8), nibble);
    __m256i p3 = _mm256_srli_epi16(v, 12);
    return _mm256_add_epi32(
        _mm256_add_epi32(_mm256_madd_epi16(p0, _mm256_loadu_si256((const __m256i *)xq)),
                         _mm256_madd_epi16(p1, _mm256_loadu_si256((const __m256i *)(xq + 16)))),
        _mm256_add_epi32(_mm256_madd_epi16(p2, _mm256_loadu_si256((const __m256i *)(xq + 32))),
                         _mm256_madd_epi16(p3, _mm256_loadu_si256((const __m256i *)(xq + 48)))));
}

/* Four pairs' lanes -> [b0 b2 b4 b6 | b1 b3 b5 b7], each a block's whole dot. */
static TARGET inline __m256i blocks8(__m256i v01, __m256i v23, __m256i v45, __m256i v67)
{
    __m256i t = _mm256_add_epi32(_mm256_unpacklo_epi32(v01, v23), _mm256_unpackhi_epi32(v01, v23));
    __m256i u = _mm256_add_epi32(_mm256_unpacklo_epi32(v45, v67), _mm256_unpackhi_epi32(v45, v67));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t, u), _mm256_unpackhi_epi64(t, u));
}

static const int lane_block[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* One weight row against one x row (k % 64 == 0, group % 32 == 0). With a scale per block
 * (group 32, Kimi's) the min terms ride in the loop, m_b gsum_b a lane (as a dot of their own
 * they were 8% of a Kimi MoE layer's time); otherwise s_b d_b is built lane by lane and the
 * min terms are one dot at the end. */
static TARGET inline float dot_row(const KhRow *w, const KhI16 *x)
{
    const __m128i halves = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    int64_t k = w->k, nb = k / 32, groups = k / w->group, per_group = w->group / 32, b0, b;
    __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
    float tail_min = 0.0f;
    for (b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t *q = w->q + b0 * 16;
        const int16_t *xq = x->q + b0 * 32;
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8, p, l;
        __m256i v[4];
        __m256 sd;
        _mm_prefetch((const char *)(q + KH_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(q + 64 + KH_PREFETCH), _MM_HINT_T0);
        for (p = 0; p < 4; p++)
            v[p] = 2 * p < count ? pair_dots(q + 32 * p, xq + 64 * p) : _mm256_setzero_si256();
        if (per_group == 1 && count == 8) {  /* s, m, d, gsum in lanes [0 2 4 6 | 1 3 5 7] */
            __m256 s = _mm256_cvtph_ps(
                _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(w->scales + b0)), halves));
            __m256 m = w->mins ? _mm256_cvtph_ps(_mm_shuffle_epi8(
                                     _mm_loadu_si128((const __m128i *)(w->mins + b0)), halves))
                               : _mm256_mul_ps(s, _mm256_set1_ps(KH_SYMMETRIC_MIN(1.0f)));
            sd = _mm256_mul_ps(s, _mm256_permutevar8x32_ps(_mm256_loadu_ps(x->d + b0), lanes));
            acc_min = _mm256_fmadd_ps(
                m, _mm256_permutevar8x32_ps(_mm256_loadu_ps(x->gsum + b0), lanes), acc_min);
        } else {
            float prod[8];
            for (l = 0; l < 8; l++) {
                b = b0 + lane_block[l];
                prod[l] = lane_block[l] < count ? _cvtsh_ss(w->scales[b / per_group]) * x->d[b]
                                                : 0.0f;
            }
            for (b = b0; b < b0 + count && per_group == 1; b++)  /* a short last step */
                tail_min += (w->mins ? _cvtsh_ss(w->mins[b])
                                     : KH_SYMMETRIC_MIN(_cvtsh_ss(w->scales[b]))) * x->gsum[b];
            sd = _mm256_loadu_ps(prod);
        }
        acc = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(blocks8(v[0], v[1], v[2], v[3])), acc);
    }
    if (per_group == 1) return hsum256(acc) + (hsum256(acc_min) + tail_min);
    return hsum256(acc) + (w->mins ? kh_halves_dot_avx2(w->mins, x->gsum, groups)
                                   : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w->scales, x->gsum,
                                                                         groups)));
}

/* One x row against 4 weight rows (a decode token). */
TARGET void kh_i16_rows4_avx2(const KhRow *w, const KhI16 *x, float *y)
{
    int i;
    for (i = 0; i < 4; i++) y[i] = dot_row(&w[i], x);
}

/* One weight row against `rows` x rows (a segment of several routes): the row stays in L1
 * after the first. */
TARGET void kh_i16_rows_avx2(const KhRow *w, const KhI16 *x, int64_t rows, float *y,
                             int64_t y_stride)
{
    int64_t k = w->k, nb = k / 32, groups = k / w->group, r;
    for (r = 0; r < rows; r++) {
        KhI16 one = {x->q + r * k, x->d + r * nb, x->gsum + r * groups};
        y[r * y_stride] = dot_row(w, &one);
    }
}

#else
typedef int kh_no_x86_simd_i16_avx2; /* ISO C forbids an empty translation unit */
#endif
