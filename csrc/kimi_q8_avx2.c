/* AVX2 Q8_0 x Q8 row kernel, compiled for AVX2/FMA/F16C by function attribute and chosen at
 * run time. maddubs needs an unsigned operand, so per block of 32: |w| (unsigned; |-128|
 * reads as 128) meets x with w's sign moved onto it (sign_epi8), which gives the same
 * products; 16 int16 pair sums (at most 2 * 128 * 127, no saturation), madd by ones gives 8
 * int32, and one FMA adds them times s_b * d_b. Blocks go 8 at a time, so the 8 scale
 * products of a row are one vector multiply. Memory traffic: 34 bytes per 32 weights. */
#include "kimi_simd.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

#define KH_TARGET __attribute__((target("avx2,fma,f16c")))

KH_TARGET void kh_q8q8_row_avx2(const int8_t *w, const uint16_t *s, int64_t k, const KhQ8 *x,
                                int64_t rows, float *y, int64_t y_stride)
{
    const __m256i ones = _mm256_set1_epi16(1);
    int64_t nb = k / KH_Q8_BLOCK, b0, r;
    __m256 acc[KH_MAX_ROWS];
    float sblk[8], sd[8];
    for (r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8, j;
        _mm_prefetch((const char *)(w + b0 * 32 + KH_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + b0 * 32 + 64 + KH_PREFETCH), _MM_HINT_T0);
        if (count == 8)
            _mm256_storeu_ps(sblk, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + b0))));
        else
            for (j = 0; j < count; j++) sblk[j] = _cvtsh_ss(s[b0 + j]);
        for (r = 0; r < rows; r++) {
            const int8_t *xr = x->q + r * k;
            const float *d = x->d + r * nb + b0;
            if (count == 8)
                _mm256_storeu_ps(sd, _mm256_mul_ps(_mm256_loadu_ps(sblk), _mm256_loadu_ps(d)));
            else
                for (j = 0; j < count; j++) sd[j] = sblk[j] * d[j];
            for (j = 0; j < count; j++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (b0 + j) * 32));
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xr + (b0 + j) * 32));
                __m256i dot = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)), ones);
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[j]), _mm256_cvtepi32_ps(dot),
                                         acc[r]);
            }
        }
    }
    for (r = 0; r < rows; r++) y[r * y_stride] = hsum256(acc[r]);
}

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
