/* AVX2 + FMA + F16C float GEMV kernels (kimi_gemv_body.h at 8 lanes): INT4 blocks for
 * group % 32 == 0, fp16 and bf16 rows. Compiled for those targets by function attribute and
 * chosen at run time, so the default build stays portable. */
#include "kimi_simd.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

int kh_cpu_has_avx2(void)
{
    static int known = -1; /* racing first calls all store the same answer */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                && __builtin_cpu_supports("f16c");
    }
    return known;
}

#define KH_G_FN(name) name##_avx2
#define KH_G_TARGET __attribute__((target("avx2,fma,f16c")))
#define KH_G_VEC __m256
#define KH_G_LANES 8
#define KH_G_ZERO() _mm256_setzero_ps()
#define KH_G_SET1(f) _mm256_set1_ps(f)
#define KH_G_LOAD(p) _mm256_loadu_ps(p)
#define KH_G_STORE(p, v) _mm256_storeu_ps(p, v)
#define KH_G_ADD(a, b) _mm256_add_ps(a, b)
#define KH_G_MUL(a, b) _mm256_mul_ps(a, b)
#define KH_G_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define KH_G_SUM(v) hsum256(v)
#define KH_G_HALVES(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
/* bfloat16 is the high half of an fp32: a shift. */
#define KH_G_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32(                                \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
/* The scale as a broadcast: a block's dot is scaled once (KH_G_SCALE_AFTER below). */
#define KH_G_SCALES(f) _mm256_set1_ps(f)
/* Two FMA chains a row and 4 rows a pass (8 of 16 ymm): with four chains only 2 rows fit
 * the registers, and decoding a block again for each further pair of rows cost 4 and 8 rows
 * 25% (decode was 15 instructions a block at 8 lanes then), more than one row gains (15%). 8 rows
 * take two passes, as fast as the one pass of 16 accumulators before. */
#define KH_G_CHAINS 2
/* A block's dot scaled once, not its codes (kimi_gemv_body.h says why and what it measured). */
#define KH_G_SCALE_AFTER 1
/* The block's 16 bytes 8 at a time, each byte widened to an int32 lane straight from memory:
 * its low nibble is code i, the byte shifted right by 4 code 16 + i. 10 instructions a block
 * where splitting the 16 bytes' nibbles first took 14, and the same codes in c[0..3]. */
#define KH_G_DECODE_RAW(p, mask, c)                                                        \
    do {                                                                                   \
        const __m256i low_ = _mm256_set1_epi32(0x0f);                                      \
        __m256i b0_ = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)));         \
        __m256i b1_ = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((p) + 8)));   \
        c[0] = _mm256_cvtepi32_ps(_mm256_and_si256(b0_, low_));                            \
        c[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b1_, low_));                            \
        c[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0_, 4));                              \
        c[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1_, 4));                              \
    } while (0)
#define KH_G_PASS_ROWS 4
#include "kimi_gemv_body.h"

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
