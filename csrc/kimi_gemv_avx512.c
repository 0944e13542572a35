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
/* A block's 16 code bytes decoded by a table: sc holds fl(i * f) for i = 0..15, and vpermps
 * reads only an index's low 4 bits, so a byte widened to a lane picks its low nibble's value
 * (the even element) as it is, and its high nibble's (the odd one) after a shift: two
 * permutes in place of masking, converting and scaling each vector. fl(i * f) is the product
 * the scale-after-convert order computes, so the results are the same bits. */
#define KH_G_SCALES(f)                                                                     \
    _mm512_mul_ps(_mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),     \
                  _mm512_set1_ps(f))
#define KH_G_DECODE(p, mask, sc, c)                                                        \
    do {                                                                                   \
        __m512i bytes_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)));     \
        (void)(mask);                                                                      \
        c[0] = _mm512_permutexvar_ps(bytes_, sc);                                          \
        c[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes_, 4), sc);                    \
    } while (0)
#define KH_G_PASS_ROWS 4 /* x rows a pass, four FMA chains each: 16 of 32 zmm */
#include "kimi_gemv_body.h"

#else
typedef int kh_no_x86_simd512; /* ISO C forbids an empty translation unit */
#endif
