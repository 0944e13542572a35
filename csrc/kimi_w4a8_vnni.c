/* VNNI W4A8 and Q8_0 kernels: vpdpbusd multiplies 4 unsigned bytes by 4 signed ones and adds
 * the sum to an int32 lane in one instruction, where AVX2 needs maddubs, an int16 add and madd.
 * Two sets, chosen at run time (w4a8_simd):
 *   AVX-512 VNNI (with F, BW, VL): two pairs of blocks (64 code bytes) per vpdpbusd in
 *     512 bits; a lone pair and the Q8_0 head in 256 bits (EVEX);
 *   AVX-VNNI: the 256-bit VEX form, on CPUs that have it without AVX-512.
 * Both compile kimi_int8_body.h, the AVX2 kernels' text, with only the integer step
 * replaced, so their results are the AVX2 kernels' bits (tests/ops/test_w4a8.py compares
 * them for equality on every level the machine has). Also x's quantizer on AVX-512
 * (kh_quantize_block_avx512), the AVX2 one's bits.
 *
 * -DKH_VNNI_EMULATE (tests/vnni_emulated.sh only, never a shipped build): compiled for AVX2
 * and with every VNNI set reported present, for SIMDe's portable instructions to stand in
 * on a machine without VNNI. */
#include "kimi_simd.h"

#include <float.h>
#include <string.h>

#if KH_HAVE_X86_SIMD
#include <immintrin.h>
#ifdef KH_VNNI_EMULATE
#include "simde_vnni.h" /* written by tests/vnni_emulated.sh */
#endif

/* AVX-VNNI's intrinsics came with GCC 11 and clang 12. */
#if defined(__clang__) ? (__clang_major__ >= 12) : (__GNUC__ >= 11)
#define KH_HAVE_AVXVNNI 1
#else
#define KH_HAVE_AVXVNNI 0
#endif

#ifdef KH_VNNI_EMULATE
#define KH_TARGET_VNNI512 __attribute__((target("avx2,fma,f16c")))
#define KH_TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c")))
#else
#define KH_TARGET_VNNI512 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define KH_TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#endif

int kh_cpu_has_avx512vnni(void)
{
#ifdef KH_VNNI_EMULATE
    return 1;
#else
    static int known = -1; /* racing first calls all store the same answer */
    if (known < 0) {
        __builtin_cpu_init();
        known = kh_cpu_has_avx512() && __builtin_cpu_supports("avx512bw")
                && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
    return known;
#endif
}

int kh_cpu_has_avxvnni(void)
{
#if defined(KH_VNNI_EMULATE)
    return 1;
#elif KH_HAVE_AVXVNNI
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = kh_cpu_has_avx2() && __builtin_cpu_supports("avxvnni");
    }
    return known;
#else
    return 0;
#endif
}

/* kh_quantize_block_avx2's operations on 16 lanes (the same codes, d and sum): max of |x|'s
 * bits, d = amax / 127, x * (1/d) truncated (0 where NaN), a half rounded away from zero (the compare
 * masks add and subtract 1 where AVX2 subtracts its all-ones compares), clamped to +-127;
 * vpmovsdb packs the codes in order, where AVX2 needs two packs and a permute. Half the
 * instructions of a block, on every x row of a W4A8 or Q8_0 call. */
static KH_TARGET_VNNI512 inline __m512i codes_at_scale(const __m512i *bits, __m512 scale,
                                                       int8_t *dst, int deinterleave)
{
    const __m512i one = _mm512_set1_epi32(1);
    const __m512 half = _mm512_set1_ps(0.5f), minus_half = _mm512_set1_ps(-0.5f);
    __m512i q[2];
    __m256i bytes;
    int j;
    for (j = 0; j < 2; j++) {
        __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(bits[j]), scale);
        __m512i i;
        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v); /* NaN -> 0 */
        i = _mm512_cvttps_epi32(v);
        __m512 frac = _mm512_sub_ps(v, _mm512_cvtepi32_ps(i));
        i = _mm512_mask_add_epi32(i, _mm512_cmp_ps_mask(frac, half, _CMP_GE_OQ), i, one);
        i = _mm512_mask_sub_epi32(i, _mm512_cmp_ps_mask(frac, minus_half, _CMP_LE_OQ), i, one);
        q[j] = _mm512_min_epi32(_mm512_max_epi32(i, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
    }
    bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(q[0])),
                                    _mm512_cvtsepi32_epi8(q[1]), 1);
    if (deinterleave) { /* per lane evens then odds, then the two lanes' evens first */
        const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                               0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, split), 0xd8);
    }
    _mm256_storeu_si256((__m256i *)dst, bytes);
    return _mm512_add_epi32(q[0], q[1]);
}

/* The largest |x| of a block's 32 floats, as bits, in each of 16 lanes (a NaN above all). */
static KH_TARGET_VNNI512 inline __m512i block_top(const float *src, __m512i *bits)
{
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    bits[0] = _mm512_loadu_si512((const void *)src);
    bits[1] = _mm512_loadu_si512((const void *)(src + 16));
    return _mm512_max_epi32(_mm512_and_si512(bits[0], magnitude),
                            _mm512_and_si512(bits[1], magnitude));
}

KH_TARGET_VNNI512 float kh_quantize_block_avx512(const float *src, int8_t *dst, int32_t *sum,
                                                 int deinterleave)
{
    __m512i bits[2];
    int32_t top_bits = _mm512_reduce_max_epi32(block_top(src, bits));
    float amax, d, inv;
    memcpy(&amax, &top_bits, sizeof amax);
    d = amax / 127.0f;
    if (!(d >= FLT_MIN)) d = 0.0f; /* also NaN */
    inv = d > 0.0f ? 1.0f / d : 0.0f;
    *sum = _mm512_reduce_add_epi32(codes_at_scale(bits, _mm512_set1_ps(inv), dst, deinterleave));
    return d;
}

/* Lane j of the result = v[j]'s 16 lanes reduced (max, or add when add is set), for 16 blocks
 * in 4 rounds of 2 permutes and 1 op a pair: each round halves the lanes a block holds. */
static KH_TARGET_VNNI512 inline __m512i reduce_16(__m512i *v, int add)
{
    static const int32_t low[4][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
        {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
        {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
        {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}};
    int round, n, j;
    for (round = 0, n = 16; round < 4; round++, n /= 2) {
        __m512i lo = _mm512_loadu_si512((const void *)low[round]);
        __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8 >> round));
        for (j = 0; j < n / 2; j++) {
            __m512i a = _mm512_permutex2var_epi32(v[2 * j], lo, v[2 * j + 1]);
            __m512i b = _mm512_permutex2var_epi32(v[2 * j], hi, v[2 * j + 1]);
            v[j] = add ? _mm512_add_epi32(a, b) : _mm512_max_epi32(a, b);
        }
    }
    return v[0];
}

/* Blocks [0, nb) of src quantized as kh_quantize_block_avx512 quantizes each (the same codes,
 * d and sums), 16 blocks at a time: their maxima and sums reduced together (reduce_16), d and
 * 1/d by one vector divide each, where a block alone paid two horizontal reductions and two
 * scalar divides in a chain (~a third of the calling thread's own work in a verify step). */
KH_TARGET_VNNI512 void kh_quantize_blocks_avx512(const float *src, int64_t nb, int8_t *dst,
                                                 float *d, int32_t *sum, int deinterleave)
{
    int64_t b0;
    for (b0 = 0; b0 < nb; b0 += 16) {
        int n = nb - b0 < 16 ? (int)(nb - b0) : 16, j;
        __mmask16 lanes = (__mmask16)((1u << n) - 1);
        __m512i bits[16][2], v[16];
        __m512 scale, dv;
        float inv[16];
        for (j = 0; j < 16; j++)
            v[j] = j < n ? block_top(src + (b0 + j) * KH_Q8_BLOCK, bits[j])
                         : _mm512_setzero_si512();
        dv = _mm512_div_ps(_mm512_castsi512_ps(reduce_16(v, 0)), _mm512_set1_ps(127.0f));
        dv = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(dv, _mm512_set1_ps(FLT_MIN), _CMP_GE_OQ), dv);
        scale = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(dv, _mm512_setzero_ps(), _CMP_GT_OQ),
                                    _mm512_set1_ps(1.0f), dv);
        _mm512_mask_storeu_ps(d + b0, lanes, dv);
        _mm512_storeu_ps(inv, scale);
        for (j = 0; j < 16; j++)
            v[j] = j < n ? codes_at_scale(bits[j], _mm512_set1_ps(inv[j]),
                                          dst + (b0 + j) * KH_Q8_BLOCK, deinterleave)
                         : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(sum + b0, lanes, reduce_16(v, 1));
    }
}

/* Both sets' integer steps, by their vpdpbusd (KH_DPBUSD(acc, unsigned, signed)). */
#define KH_I8_DOT4(lo, hi, even, odd) \
    KH_DPBUSD(KH_DPBUSD(_mm256_setzero_si256(), lo, even), hi, odd)
#define KH_I8_SDOT(w, x) \
    KH_DPBUSD(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(x, w))

/* AVX-512 VNNI: kh_q8_rows4_vnni512, kh_q8_pairs_vnni512, kh_q8q8_row_vnni512. */
#define KH_I8_FN(name) name##_vnni512
#define KH_I8_TARGET KH_TARGET_VNNI512
#define KH_I8_WIDE 1
#define KH_DPBUSD _mm256_dpbusd_epi32
#include "kimi_int8_body.h"
#undef KH_I8_FN
#undef KH_I8_TARGET
#undef KH_I8_WIDE
#undef KH_DPBUSD

#if KH_HAVE_AVXVNNI
/* AVX-VNNI: kh_q8_rows4_avxvnni, kh_q8_pairs_avxvnni, kh_q8q8_row_avxvnni. */
#define KH_I8_FN(name) name##_avxvnni
#define KH_I8_TARGET KH_TARGET_AVXVNNI
#define KH_I8_WIDE 0
#define KH_DPBUSD _mm256_dpbusd_avx_epi32
#include "kimi_int8_body.h"
#else
/* A compiler without AVX-VNNI: kh_cpu_has_avxvnni() is 0, so these never run. */
void kh_q8_rows4_avxvnni(const KhRow *w, const KhQ8 *x, float *y)
{
    kh_q8_rows4_avx2(w, x, y);
}
void kh_q8_pairs_avxvnni(const KhRow *w, const KhQ8 *x, int64_t rows, float *y, int64_t y_stride)
{
    kh_q8_pairs_avx2(w, x, rows, y, y_stride);
}
void kh_q8q8_row_avxvnni(const int8_t *w, const uint16_t *s, int64_t k, const KhQ8 *x,
                         int64_t rows, float *y, int64_t y_stride)
{
    kh_q8q8_row_avx2(w, s, k, x, rows, y, y_stride);
}
#endif

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
