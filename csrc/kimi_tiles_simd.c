/* The W4A8 tile kernels (kimi_tiles.h) for AVX-512 VNNI and AVX2, each the operations of
 * kimi_tiles.c's tiles_c, 16 outputs per vector (AVX2: two halves of 8):
 *   per chunk of 8 inputs: codes = 64 bytes; lo = codes & 15, hi = codes >> 4 & 15;
 *     per x row: idot += lo . bcast(x[8c..8c+3]) + hi . bcast(x[8c+4..8c+7]) (4 bytes a lane)
 *   per block of 32: acc = fma(float(idot), s * d_b, acc); per group: acc = fma(m, gsum, acc)
 * vpdpbusd takes unsigned codes times signed x; AVX2 gets the same int32 by maddubs (at most
 * 2 * 15 * 127 per int16: no saturation) and madd with ones. The float steps are the same
 * instructions on the same values in every lane, so both give tiles_c's bits.
 *
 * Register blocks: MR x rows by NT tiles, instantiated per (MR, NT) with the loops unrolled,
 * so the accumulators stay in registers: AVX-512 (32 registers) 1..8 rows by one tile for
 * decode and verify steps, 4 x 2 (and 1-2 rows x 4 tiles) for prefill; AVX2 (16) 2 x 1. */
#include "kimi_tiles.h"

#if KH_HAVE_X86_SIMD
#include "kimi_tiles_simd.h"

#define TILE_PREFETCH 1024 /* bytes ahead in each tile's stream of codes (AVX2) */

static TARGET512 inline __attribute__((always_inline)) void body512(
    const KhTiles *w, int64_t t0, const int NT, const KhQ8 *x, const int32_t *xsum, int64_t r0,
    const int MR, float *out)
{
    const int64_t k = w->k, groups = k / w->group, per_group = w->group / KH_Q8_BLOCK;
    const __m512i mask = _mm512_set1_epi8(0x0f);
    /* this row block of x, interleaved (kimi_tiles.h): one pointer each, stepped by block */
    const int8_t *xq = x->q + r0 * k;
    const float *xd = x->d + r0 * (k / KH_Q8_BLOCK), *xg = x->gsum + r0 * groups;
    const uint8_t *tq[4];
    const uint16_t *ts[4], *tm[4];
    __m512 acc[KH_TILES_MR512][4];
    int64_t g, b;
    int r, t, c;
    (void)xsum;
    for (t = 0; t < NT; t++) {
        tq[t] = w->q + (t0 + t) * (k / 8) * 64;
        ts[t] = w->s + (t0 + t) * groups * KH_TILE;
        tm[t] = w->m ? w->m + (t0 + t) * groups * KH_TILE : NULL;
    }
    for (r = 0; r < MR; r++)
        for (t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (g = 0; g < groups; g++) {
        __m512 s[4], m[4];
        for (t = 0; t < NT; t++) {
            s[t] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ts[t] + g * KH_TILE)));
            m[t] = tm[t] ? _mm512_cvtph_ps(
                               _mm256_loadu_si256((const __m256i *)(tm[t] + g * KH_TILE)))
                         : _mm512_mul_ps(s[t], _mm512_set1_ps(-8.0f));
        }
        for (b = 0; b < per_group; b++, xq += 32 * MR, xd += MR) {
            __m512i dot[KH_TILES_MR512][4];
            for (r = 0; r < MR; r++)
                for (t = 0; t < NT; t++) dot[r][t] = _mm512_setzero_si512();
            for (c = 0; c < 4; c++) {
                __m512i xa[KH_TILES_MR512], xb[KH_TILES_MR512];
                for (r = 0; r < MR; r++) {
                    xa[r] = _mm512_set1_epi32(load4(xq + (c * MR + r) * 8));
                    xb[r] = _mm512_set1_epi32(load4(xq + (c * MR + r) * 8 + 4));
                }
                for (t = 0; t < NT; t++) {
                    __m512i raw = _mm512_loadu_si512((const void *)(tq[t] + c * 64));
                    __m512i lo = _mm512_and_si512(raw, mask);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
                    _mm_prefetch((const char *)(tq[t] + c * 64 + KH_TILES_PREFETCH),
                                 _MM_HINT_T0);
                    for (r = 0; r < MR; r++)
                        dot[r][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[r][t], lo, xa[r]),
                                                        hi, xb[r]);
                }
            }
            for (t = 0; t < NT; t++) tq[t] += 4 * 64;
            for (r = 0; r < MR; r++) {
                __m512 d = _mm512_set1_ps(xd[r]);
                for (t = 0; t < NT; t++)
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][t]),
                                                _mm512_mul_ps(s[t], d), acc[r][t]);
            }
        }
        for (r = 0; r < MR; r++) {
            __m512 gs = _mm512_set1_ps(xg[g * MR + r]);
            for (t = 0; t < NT; t++) acc[r][t] = _mm512_fmadd_ps(m[t], gs, acc[r][t]);
        }
    }
    for (r = 0; r < MR; r++)
        for (t = 0; t < NT; t++)
            _mm512_storeu_ps(out + (r0 + r) * w->n + (t0 + t) * KH_TILE, acc[r][t]);
}

/* 16 lanes as two halves of 8: half h of tile t is lanes 8h..8h+7 (bytes 32h..32h+31 of a
 * chunk, entries 8h..8h+7 of the scales). */
static TARGET2 inline __attribute__((always_inline)) void body2(
    const KhTiles *w, int64_t t, const KhQ8 *x, int64_t r0, const int MR, float *out)
{
    const int64_t k = w->k, groups = k / w->group, per_group = w->group / KH_Q8_BLOCK;
    const int64_t nb = k / KH_Q8_BLOCK, chunks = k / 8;
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const uint8_t *tq = w->q + t * chunks * 64;
    __m256 acc[2][2];
    int64_t g, b;
    int r, h, c;
    for (r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (g = 0; g < groups; g++) {
        __m256 s[2], m[2];
        tile_scales2(w, t, g, s, m);
        for (b = g * per_group; b < (g + 1) * per_group; b++) {
            __m256i dot[2][2];
            for (r = 0; r < MR; r++) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
            for (c = 0; c < 4; c++) {
                int64_t cc = 4 * b + c;
                __m256i xa[2], xb[2];
                for (r = 0; r < MR; r++) {
                    xa[r] = _mm256_set1_epi32(load4(x->q + (r0 + r) * k + 8 * cc));
                    xb[r] = _mm256_set1_epi32(load4(x->q + (r0 + r) * k + 8 * cc + 4));
                }
                _mm_prefetch((const char *)(tq + cc * 64 + TILE_PREFETCH), _MM_HINT_T0);
                for (h = 0; h < 2; h++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(tq + cc * 64 + 32 * h));
                    __m256i lo = _mm256_and_si256(raw, mask);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                    for (r = 0; r < MR; r++) {
                        __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa[r]),
                                                     _mm256_maddubs_epi16(hi, xb[r]));
                        dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(p, ones));
                    }
                }
            }
            for (r = 0; r < MR; r++) {
                __m256 d = _mm256_set1_ps(x->d[(r0 + r) * nb + b]);
                for (h = 0; h < 2; h++)
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]),
                                                _mm256_mul_ps(s[h], d), acc[r][h]);
            }
        }
        for (r = 0; r < MR; r++) {
            __m256 gs = _mm256_set1_ps(x->gsum[(r0 + r) * groups + g]);
            for (h = 0; h < 2; h++) acc[r][h] = _mm256_fmadd_ps(m[h], gs, acc[r][h]);
        }
    }
    for (r = 0; r < MR; r++)
        for (h = 0; h < 2; h++)
            _mm256_storeu_ps(out + (r0 + r) * w->n + t * KH_TILE + 8 * h, acc[r][h]);
}

KH_TILES_ENTRIES(KhTiles, kh_tiles_vnni512, kh_tiles_vnni512_decode, kh_tiles_avx2)

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
