/* The W4A16 int16-dot kernels (kimi_i16_body.h), two sets chosen at run time by
 * kh_moe_i16_runs (kimi_moe_i16.c) under w4a8_simd's level:
 *   AVX-512 VNNI: a pair of blocks (64 weights) is 32 code bytes widened to 32 words in one
 *     vpmovzxbw, a mask and a shift for the nibbles, two vpdpwssd into 16 int32 lanes (block
 *     2p in 0-7), one convert and one FMA with the products permuted to their lanes;
 *   AVX2 (AVX-VNNI CPUs too): a block at a time in 256 bits, vpmaddwd and an add in place of
 *     vpdpwssd, even and odd blocks into two accumulators (the FMA's latency).
 * Both sets' dots are exact int32 (at most 4 * 15 * 32767 a lane); their float sums run in
 * other orders, so the two sets' results differ in the last bits, and each is the same bits
 * for a token alone or in a batch.
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
#undef I16_FN
#undef I16_TARGET
#undef I16_ACC
#undef I16_ZERO
#undef I16_PAIR
#undef I16_SUM

#define I16_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

typedef struct {
    __m256 even, odd; /* blocks 2p and 2p+1: two FMA chains */
} I16Acc2;

/* Block b's 8 int32 lane sums: its 16 code bytes widened, low nibbles against the even x
 * codes xe, high against the odd xo. */
static I16_TARGET_AVX2 inline __m256i block_dots(const uint8_t *q, const int16_t *xe,
                                                 const int16_t *xo)
{
    __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)q));
    __m256i lo = _mm256_and_si256(words, _mm256_set1_epi16(0x0f));
    __m256i hi = _mm256_srli_epi16(words, 4);
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)xe)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)xo)));
}

static I16_TARGET_AVX2 inline I16Acc2 pair_avx2(I16Acc2 acc, __m256 sd, int p, const uint8_t *q,
                                                const int16_t *xq)
{
    float lanes[8];
    __m256 s0, s1;
    _mm256_storeu_ps(lanes, sd);
    s0 = _mm256_broadcast_ss(&lanes[2 * p]);
    s1 = _mm256_broadcast_ss(&lanes[2 * p + 1]);
    acc.even = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(block_dots(q, xq, xq + 32)), acc.even);
    acc.odd = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(block_dots(q + 16, xq + 16, xq + 48)),
                              acc.odd);
    return acc;
}

#define I16_FN(name) name##_avx2
#define I16_TARGET I16_TARGET_AVX2
#define I16_ACC I16Acc2
#define I16_ZERO ((I16Acc2){_mm256_setzero_ps(), _mm256_setzero_ps()})
#define I16_PAIR(acc, sd, p, q, xq) ((acc) = pair_avx2(acc, sd, p, q, xq))
#define I16_SUM(acc) hsum256(_mm256_add_ps((acc).even, (acc).odd))
#include "kimi_i16_body.h"

#else
typedef int kh_no_x86_simd_i16; /* ISO C forbids an empty translation unit */
#endif
