/* The Q8_0 tile kernels (kimi_tiles.h, KhQ8Tiles) for AVX-512 VNNI and AVX2, each the
 * operations of kimi_q8_tiles.c's q8_tiles_c, 16 outputs per vector (AVX2: two halves of 8):
 *   per block of 32 inputs (8 chunks of 4): the exact int32 dot, then
 *   acc = fma(float(dot), s * d_b, acc)
 * AVX-512 VNNI: vpdpbusd meets w ^ 0x80 = w + 128 (unsigned) and x, starting from
 * -128 * sum(x's codes in the block). AVX2: maddubs of |w| and x signed by w (at most
 * 2 * 128 * 127 per int16), then madd with ones. Register blocks as kimi_tiles_simd.c's. */
#include "kimi_tiles.h"

#if KH_HAVE_X86_SIMD
#include "kimi_tiles_simd.h"

static TARGET512 inline __attribute__((always_inline)) void body512(
    const KhQ8Tiles *w, int64_t t0, const int NT, const KhQ8 *x, const int32_t *xsum,
    int64_t r0, const int MR, float *out)
{
    const int64_t k = w->k, nb = k / KH_Q8_BLOCK;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    /* this row block of x, interleaved (kimi_tiles.h): one pointer each, stepped by block */
    const int8_t *xq = x->q + r0 * k;
    const float *xd = x->d + r0 * nb;
    const int32_t *xs = xsum + r0 * nb;
    const int8_t *tq[4];
    const uint16_t *ts[4];
    __m512 acc[KH_TILES_MR512][4];
    int64_t b;
    int r, t, c;
    for (t = 0; t < NT; t++) {
        tq[t] = w->q + (t0 + t) * (k / 4) * 64;
        ts[t] = w->s + (t0 + t) * nb * KH_TILE;
    }
    for (r = 0; r < MR; r++)
        for (t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (b = 0; b < nb; b++, xq += 32 * MR, xd += MR, xs += MR) {
        __m512i dot[KH_TILES_MR512][4];
        for (r = 0; r < MR; r++) {
            __m512i start = _mm512_set1_epi32(-128 * xs[r]);
            for (t = 0; t < NT; t++) dot[r][t] = start;
        }
        for (c = 0; c < 8; c++) {
            __m512i xv[KH_TILES_MR512];
            for (r = 0; r < MR; r++)
                xv[r] = _mm512_set1_epi32(load4(xq + ((c / 2) * MR + r) * 8 + 4 * (c % 2)));
            for (t = 0; t < NT; t++) {
                __m512i u =
                    _mm512_xor_si512(_mm512_loadu_si512((const void *)(tq[t] + c * 64)), flip);
                _mm_prefetch((const char *)(tq[t] + c * 64 + KH_TILES_PREFETCH), _MM_HINT_T0);
                for (r = 0; r < MR; r++) dot[r][t] = _mm512_dpbusd_epi32(dot[r][t], u, xv[r]);
            }
        }
        for (t = 0; t < NT; t++) {
            __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ts[t] + b * KH_TILE)));
            tq[t] += 8 * 64;
            for (r = 0; r < MR; r++)
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][t]),
                                            _mm512_mul_ps(s, _mm512_set1_ps(xd[r])), acc[r][t]);
        }
    }
    for (r = 0; r < MR; r++)
        for (t = 0; t < NT; t++)
            _mm512_storeu_ps(out + (r0 + r) * w->n + (t0 + t) * KH_TILE, acc[r][t]);
}

/* One tile (two halves of 8 lanes) against MR rows. */
static TARGET2 inline __attribute__((always_inline)) void body2(
    const KhQ8Tiles *w, int64_t t, const KhQ8 *x, int64_t r0, const int MR, float *out)
{
    const int64_t k = w->k, nb = k / KH_Q8_BLOCK, chunks = k / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *tq = w->q + t * chunks * 64;
    __m256 acc[2][2];
    int64_t b;
    int r, h, c;
    for (r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (b = 0; b < nb; b++) {
        __m256i dot[2][2];
        for (r = 0; r < MR; r++) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
        for (c = 0; c < 8; c++) {
            int64_t cc = 8 * b + c;
            __m256i xv[2];
            for (r = 0; r < MR; r++) xv[r] = _mm256_set1_epi32(load4(x->q + (r0 + r) * k + 4 * cc));
            _mm_prefetch((const char *)(tq + cc * 64 + 1024), _MM_HINT_T0);
            for (h = 0; h < 2; h++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(tq + cc * 64 + 32 * h));
                __m256i mag = _mm256_abs_epi8(wv);
                for (r = 0; r < MR; r++)
                    dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xv[r], wv)), ones));
            }
        }
        for (h = 0; h < 2; h++) {
            __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(
                (const __m128i *)(w->s + (t * nb + b) * KH_TILE + 8 * h)));
            for (r = 0; r < MR; r++)
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]),
                                            _mm256_mul_ps(s, _mm256_set1_ps(x->d[(r0 + r) * nb + b])),
                                            acc[r][h]);
        }
    }
    for (r = 0; r < MR; r++)
        for (h = 0; h < 2; h++)
            _mm256_storeu_ps(out + (r0 + r) * w->n + t * KH_TILE + 8 * h, acc[r][h]);
}

KH_TILES_ENTRIES(KhQ8Tiles, kh_q8_tiles_vnni512, kh_q8_tiles_vnni512_decode, kh_q8_tiles_avx2)

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
