/* The W4A16 int16-dot kernels for AVX-512 VNNI (kimi_i16_body.h), chosen at run time by
 * kh_moe_i16_pick (kimi_moe_i16.c) at w4a8_simd's level 3: a pair of blocks (64 weights) is
 * 32 code bytes widened to 32 words in one vpmovzxbw, a mask and a shift for the nibbles, two
 * vpdpwssd into 16 int32 lanes (block 2p in 0-7), one convert and one FMA with the products
 * permuted to their lanes. AVX2 CPUs run kimi_i16_avx2.c's set, which reads the x codes in
 * another layout. The dots are exact int32 (at most 4 * 15 * 32767 a lane), and a token's
 * result is the same bits alone or in a batch.
 *
 * -DKH_VNNI_EMULATE (tests/vnni_emulated.sh only): AVX2 code with SIMDe's instructions for
 * the AVX-512 ones, as in kimi_w4a8_vnni.c. */
#include "kimi_moe.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>
#ifdef KH_VNNI_EMULATE
#include "simde_vnni.h"
#define I16_TARGET_512 __attribute__((target("avx2,fma,f16c")))
/* SIMDe has no vpmovzxbw to 512 bits: two 256-bit ones, the same words */
#define _mm512_cvtepu8_epi16(v) _mm512_inserti64x4(                                           \
    _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(v))),                  \
    _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)), 1)
#else
#define I16_TARGET_512 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

/* Pair p of 8 blocks: which of the 8 products s_b d_b each int32 lane of its dots takes. */
static const int32_t pair_lanes[4][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7}};

static I16_TARGET_512 inline __m512 pair_512(__m512 acc, __m256 sd, int p, const uint8_t *q,
                                             const int16_t *xq)
{
    __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)q));
    __m512i lo = _mm512_and_si512(words, _mm512_set1_epi16(0x0f));
    __m512i hi = _mm512_srli_epi16(words, 4);
    __m512i dots = _mm512_dpwssd_epi32(
        _mm512_dpwssd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512((const void *)xq)),
        hi, _mm512_loadu_si512((const void *)(xq + 32)));
    __m512 scale = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)pair_lanes[p]),
                                         _mm512_castps256_ps512(sd));
    return _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dots), acc);
}

#define I16_FN(name) name##_vnni512
#define I16_TARGET I16_TARGET_512
#define I16_ACC __m512
#define I16_ZERO _mm512_setzero_ps()
#define I16_PAIR(acc, sd, p, q, xq) ((acc) = pair_512(acc, sd, p, q, xq))
#define I16_SUM(acc) _mm512_reduce_add_ps(acc)
#include "kimi_i16_body.h"
#else
typedef int kh_no_x86_simd_i16; /* ISO C forbids an empty translation unit */
#endif
