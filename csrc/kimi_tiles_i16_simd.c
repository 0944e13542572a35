/* The W4A16 tile kernels (kimi_tiles_i16.c says what they compute) for AVX-512 VNNI and
 * AVX2, 16 outputs a vector (AVX2: two halves of 8), each tiles_i16_c's operations:
 *   per chunk of 8 inputs: codes = 64 bytes; lo = codes & 15, hi = codes >> 4 & 15;
 *     per x row: four sums, xl . lo, xl . hi (codes the signed side) and lo . xh, hi . xh
 *     (codes the unsigned side), 4 bytes a lane (vpdpbusd; AVX2 maddubs, then madd by ones)
 *   per block of 32: dot = 256 (xh sums) + (xl sums); acc = fma(float(dot), s * d_b, acc);
 *   per group: acc = fma(m, gsum, acc)
 * Four sums, not two: each vpdpbusd chain is 4 long a block, not 8 (the Kimi MoE layer at
 * T = 8, 2 threads, Zen 5: 5.97 -> 5.70 ms). */
#include "kimi_tiles.h"

#if KH_HAVE_X86_SIMD
#include "kimi_tiles_simd.h"

#define MR512 4 /* x rows a call of the AVX-512 kernel: 4 integer sums and an accumulator each */

/* MR rows of x against tile t, 16 outputs a vector. */
static TARGET512 inline __attribute__((always_inline)) void body512(
    const KhTiles *w, int64_t t, const KhQ8 *x, int64_t r0, const int MR, float *out)
{
    const int64_t k = w->k, groups = k / w->group, per_group = w->group / KH_Q8_BLOCK;
    const int64_t nb = k / KH_Q8_BLOCK;
    const __m512i mask = _mm512_set1_epi8(0x0f);
    const uint8_t *tq = w->q + t * (k / 8) * 64;
    const uint16_t *ts = w->s + t * groups * KH_TILE;
    const uint16_t *tm = w->m ? w->m + t * groups * KH_TILE : NULL;
    __m512 acc[MR512];
    int64_t g, b;
    int r, c;
    for (r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (g = 0; g < groups; g++) {
        __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ts + g * KH_TILE)));
        __m512 m = tm ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tm + g * KH_TILE)))
                      : _mm512_mul_ps(s, _mm512_set1_ps(-8.0f));
        for (b = g * per_group; b < (g + 1) * per_group; b++) {
            /* 4 sums a row (xl and xh against the low and the high nibbles): chains of 4 */
            __m512i lo_dot[MR512], hi_dot[MR512], lo2[MR512], hi2[MR512];
            for (r = 0; r < MR; r++)
                lo_dot[r] = hi_dot[r] = lo2[r] = hi2[r] = _mm512_setzero_si512();
            for (c = 0; c < 4; c++, tq += 64) {
                __m512i raw = _mm512_loadu_si512((const void *)tq);
                __m512i lo = _mm512_and_si512(raw, mask);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
                _mm_prefetch((const char *)(tq + KH_TILES_PREFETCH), _MM_HINT_T0);
                for (r = 0; r < MR; r++) {
                    const int8_t *xc = x->q + (r0 + r) * 2 * k + (4 * b + c) * 16;
                    lo_dot[r] = _mm512_dpbusd_epi32(lo_dot[r], _mm512_set1_epi32(load4(xc)), lo);
                    lo2[r] = _mm512_dpbusd_epi32(lo2[r], _mm512_set1_epi32(load4(xc + 4)), hi);
                    hi_dot[r] = _mm512_dpbusd_epi32(hi_dot[r], lo,
                                                    _mm512_set1_epi32(load4(xc + 8)));
                    hi2[r] = _mm512_dpbusd_epi32(hi2[r], hi, _mm512_set1_epi32(load4(xc + 12)));
                }
            }
            for (r = 0; r < MR; r++) {
                __m512i dot = _mm512_add_epi32(
                    _mm512_slli_epi32(_mm512_add_epi32(hi_dot[r], hi2[r]), 8),
                    _mm512_add_epi32(lo_dot[r], lo2[r]));
                __m512 d = _mm512_set1_ps(x->d[(r0 + r) * nb + b]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, d), acc[r]);
            }
        }
        for (r = 0; r < MR; r++)
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x->gsum[(r0 + r) * groups + g]), acc[r]);
    }
    for (r = 0; r < MR; r++) _mm512_storeu_ps(out + (r0 + r) * w->n + t * KH_TILE, acc[r]);
}

#define BLOCK512(MR)                                                                       \
    static TARGET512 void block512_##MR(const KhTiles *w, int64_t t, const KhQ8 *x,        \
                                        int64_t r0, float *out)                            \
    {                                                                                      \
        body512(w, t, x, r0, MR, out);                                                     \
    }
BLOCK512(1) BLOCK512(2) BLOCK512(3) BLOCK512(4)
#undef BLOCK512

TARGET512 void kh_tiles_i16_vnni512(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,
                                    const int32_t *xsum, int64_t r0, int mr, float *out)
{
    static void (*const by_rows[MR512 + 1])(const KhTiles *, int64_t, const KhQ8 *, int64_t,
                                            float *) = {0, block512_1, block512_2, block512_3,
                                                        block512_4};
    int64_t t;
    (void)xsum;
    for (t = t0; t < t0 + nt; t++) by_rows[mr](tiles, t, x, r0, out);
}

/* One row of x against tile t, its 16 lanes as two halves of 8 (bytes 32h..32h+31 of a
 * chunk): maddubs's int16 sums stay far from saturation (2 * 15 * 255 per product pair, two
 * pairs added), then madd with ones gives vpdpbusd's int32. */
static TARGET2 void row_avx2(const KhTiles *w, int64_t t, const KhQ8 *x, int64_t row, float *out)
{
    const int64_t k = w->k, groups = k / w->group, per_group = w->group / KH_Q8_BLOCK;
    const int64_t nb = k / KH_Q8_BLOCK;
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const uint8_t *tq = w->q + t * (k / 8) * 64;
    const int8_t *xq = x->q + row * 2 * k;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t g, b;
    int h, c;
    for (g = 0; g < groups; g++) {
        __m256 s[2], m[2];
        tile_scales2(w, t, g, s, m);
        for (b = g * per_group; b < (g + 1) * per_group; b++) {
            /* int16 sums over chunks where they stay exact: xh's over the block's 4 (4 * 2 *
             * 2 * 15 * 128 = 30720), xl's over pairs of chunks (2 * 2 * 2 * 15 * 255 = 30600);
             * widened by madd once a block: 256 for xh, 1 for xl */
            __m256i lo_sum[2][2], hi_sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            __m256 d = _mm256_set1_ps(x->d[row * nb + b]);
            for (h = 0; h < 2; h++) lo_sum[h][0] = lo_sum[h][1] = _mm256_setzero_si256();
            for (c = 0; c < 4; c++, tq += 64) {
                const int8_t *xc = xq + (4 * b + c) * 16;
                __m256i xla = _mm256_set1_epi32(load4(xc)), xlb = _mm256_set1_epi32(load4(xc + 4));
                __m256i xha = _mm256_set1_epi32(load4(xc + 8));
                __m256i xhb = _mm256_set1_epi32(load4(xc + 12));
                _mm_prefetch((const char *)(tq + 1024), _MM_HINT_T0);
                for (h = 0; h < 2; h++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(tq + 32 * h));
                    __m256i lo = _mm256_and_si256(raw, mask);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                    lo_sum[h][c / 2] = _mm256_add_epi16(
                        lo_sum[h][c / 2], _mm256_add_epi16(_mm256_maddubs_epi16(xla, lo),
                                                           _mm256_maddubs_epi16(xlb, hi)));
                    hi_sum[h] = _mm256_add_epi16(
                        hi_sum[h], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xha),
                                                    _mm256_maddubs_epi16(hi, xhb)));
                }
            }
            for (h = 0; h < 2; h++) {
                __m256i dot = _mm256_add_epi32(
                    _mm256_madd_epi16(hi_sum[h], _mm256_set1_epi16(256)),
                    _mm256_add_epi32(_mm256_madd_epi16(lo_sum[h][0], ones),
                                     _mm256_madd_epi16(lo_sum[h][1], ones)));
                acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s[h], d), acc[h]);
            }
        }
        for (h = 0; h < 2; h++)
            acc[h] = _mm256_fmadd_ps(m[h], _mm256_set1_ps(x->gsum[row * groups + g]), acc[h]);
    }
    for (h = 0; h < 2; h++) _mm256_storeu_ps(out + row * w->n + t * KH_TILE + 8 * h, acc[h]);
}

TARGET2 void kh_tiles_i16_avx2(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,
                               const int32_t *xsum, int64_t r0, int mr, float *out)
{
    int64_t t, r;
    (void)xsum;
    for (t = t0; t < t0 + nt; t++)
        for (r = r0; r < r0 + mr; r++) row_avx2(tiles, t, x, r, out);
}

#else
typedef int kh_no_x86_simd_tiles_i16; /* ISO C forbids an empty translation unit */
#endif
