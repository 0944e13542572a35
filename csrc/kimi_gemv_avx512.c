/* AVX-512F float GEMV kernels (kimi_gemv_body.h at 16 lanes): one 16-byte block of codes
 * becomes two 16-lane vectors (even and odd elements), half the instructions of the AVX2
 * kernel; fp16 rows 16 lanes a step. Compiled for these targets by function attribute and
 * chosen at run time. */
#include "kimi_simd.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

int kh_cpu_has_avx512(void)
{
    static int known = -1; /* racing first calls all store the same answer */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && kh_cpu_has_avx2();
    }
    return known;
}

#define KH_G_FN(name) name##_avx512
#define KH_G_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))
#define KH_G_VEC __m512
#define KH_G_LANES 16
#define KH_G_ZERO() _mm512_setzero_ps()
#define KH_G_SET1(f) _mm512_set1_ps(f)
#define KH_G_LOAD(p) _mm512_loadu_ps(p)
#define KH_G_STORE(p, v) _mm512_storeu_ps(p, v)
#define KH_G_ADD(a, b) _mm512_add_ps(a, b)
#define KH_G_MUL(a, b) _mm512_mul_ps(a, b)
#define KH_G_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define KH_G_SUM(v) _mm512_reduce_add_ps(v)
#define KH_G_HALVES(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
/* Low nibbles (even elements), then high ones (odd). */
#define KH_G_UNPACK(raw, mask, c)                                                          \
    do {                                                                                   \
        c[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, mask)));         \
        c[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(                                    \
            _mm_and_si128(_mm_srli_epi16(raw, 4), mask)));                                 \
    } while (0)
#include "kimi_gemv_body.h"

#else
typedef int kh_no_x86_simd512; /* ISO C forbids an empty translation unit */
#endif
