/* kimi_tiles_i16.c: W4A16's integer dots on weights in the CPU's tiles (kimi_tiles.h's
 * layout, the one W4A8's tiles read): x rounded to int16 per block of 32 as the row-layout
 * int16 dots round it (kimi_moe_i16.c: d = max|x| / 32767, half away from zero), each code
 * split into its bytes, xq = 256 xh + xl with xl in 0..255 and xh in -128..127, so that
 * vpdpbusd (unsigned times signed bytes, 4 a lane) meets 16 output rows at once:
 *     dot_b = 256 sum(q xh) + sum(q xl)   (exact: |sum(q xh)| <= 32 * 15 * 128)
 * with the 4-bit codes q the unsigned side against xh, the signed side against xl.
 *
 * Why: the row-layout int16 kernels (kimi_i16_body.h) spend 8 vector instructions on every 64
 * weights of one output row, and are bound by them, not the memory: the Kimi MoE layer at
 * T = 1 read 50-56% of the probe on a Zen 5 in its fast mode. Here one 64-byte load, two
 * masks and four vpdpbusd cover 8 inputs of 16 rows; a convert and an FMA per block of 32.
 *
 * The codes of a row: per chunk c of 8 inputs, 16 bytes: xl of inputs 8c..8c+7, then xh of
 * the same (4 bytes meet a chunk's low nibbles, the next 4 its high ones), natural order by
 * row; d [k/32] and gsum [k/group] as kimi_moe_i16.c lays them out. Every kernel computes an
 * output by kh_tiles_portable's float steps (kimi_tiles.h) on these exact dots, so every
 * instruction set, every row count and every batch gives the same bits. Here: the rounding (AVX2 where
 * the tile kernels run SIMD, kh_round_block's bits), the portable kernel and the pick;
 * kimi_tiles_i16_simd.c has the AVX-512 VNNI and AVX2 kernels. */
#include "kimi_helper.h"
#include "kimi_tiles.h"

#include <string.h>

#define I16_BLOCK 32

int64_t kh_tiles_i16_floats(int64_t rows, int64_t k, int64_t group)
{
    if (k <= 0 || group <= 0 || k % group || group % I16_BLOCK) return -1;
    return rows * (k / 2) + rows * (k / I16_BLOCK) + rows * (k / group);
}

KhQ8 kh_tiles_i16_at(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhQ8 x;
    x.q = (int8_t *)base;
    x.d = base + rows * (k / 2);
    x.gsum = x.d + rows * (k / I16_BLOCK);
    (void)group;
    return x;
}

/* Block b's codes c [32] as their bytes: per chunk of 8, xl of the 8, then xh. */
static void split_block(const int32_t *c, int8_t *q)
{
    int j;
    for (j = 0; j < I16_BLOCK; j++) {
        int8_t *chunk = q + (j / 8) * 16;
        chunk[j % 8] = (int8_t)(uint8_t)(c[j] & 0xff);   /* xl, read as unsigned */
        chunk[8 + j % 8] = (int8_t)((c[j] - (c[j] & 0xff)) / 256);
    }
}

#if KH_HAVE_X86_SIMD
#include <float.h>
#include <immintrin.h>

/* kh_round_block(src, 32767, 1, ...) and split_block in AVX2, the same bits: the same float
 * operations per value (x * (1/d), truncation, the half tests, the clamp) 8 at a time; each
 * chunk's 8 codes packed to words, then their low bytes and their high ones shuffled apart. */
static __attribute__((target("avx2,fma,f16c"))) float round_block_avx2(const float *src,
                                                                       int8_t *q, int32_t *sum)
{
    const __m256i limit = _mm256_set1_epi32(32767);
    const __m128i apart = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256i total = _mm256_setzero_si256();
    int32_t top_bits = kh_block_top_avx2(src), lanes[8];
    float amax, d, inv;
    int j;
    memcpy(&amax, &top_bits, sizeof amax);
    d = amax / 32767.0f;
    if (!(d >= FLT_MIN)) d = amax != amax ? amax : 0.0f; /* a NaN block keeps its NaN */
    inv = d > 0.0f ? 1.0f / d : 0.0f;
    for (j = 0; j < 4; j++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + 8 * j), _mm256_set1_ps(inv));
        __m256i t;
        __m256 frac;
        __m128i words;
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> 0 */
        t = _mm256_cvttps_epi32(v);
        frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
        t = _mm256_sub_epi32(t, _mm256_castps_si256(
                                    _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
        t = _mm256_add_epi32(t, _mm256_castps_si256(
                                    _mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
        t = _mm256_max_epi32(_mm256_min_epi32(t, limit), _mm256_sub_epi32(_mm256_setzero_si256(),
                                                                          limit));
        total = _mm256_add_epi32(total, t);
        words = _mm_packs_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        _mm_storeu_si128((__m128i *)(q + 16 * j), _mm_shuffle_epi8(words, apart));
    }
    _mm256_storeu_si256((__m256i *)lanes, total);
    *sum = 0;
    for (j = 0; j < 8; j++) *sum += lanes[j];
    return d;
}
#endif

void kh_tiles_i16_quantize(const float *src, int64_t k, int64_t group, int64_t row,
                           const KhQ8 *x)
{
    int64_t nb = k / I16_BLOCK, per_group = group / I16_BLOCK, groups = k / group, b;
    int8_t *q = x->q + row * 2 * k;
    float *d = x->d + row * nb, *gsum = x->gsum + row * groups;
#if KH_HAVE_X86_SIMD
    int simd = tiles_simd() >= 1;
#endif
    for (b = 0; b < nb; b++) {
        int32_t c[I16_BLOCK], total;
#if KH_HAVE_X86_SIMD
        if (simd)
            d[b] = round_block_avx2(src + b * I16_BLOCK, q + b * 64, &total);
        else
#endif
        {
            d[b] = kh_round_block(src + b * I16_BLOCK, 32767, 1, c, &total);
            split_block(c, q + b * 64);
        }
        if (b % per_group == 0) gsum[b / per_group] = 0.0f;
        gsum[b / per_group] += d[b] * (float)total;
    }
}

void kh_tiles_i16_copy(const KhQ8 *from_x, int64_t from, const KhQ8 *to_x, int64_t to, int64_t k,
                       int64_t group)
{
    int64_t nb = k / I16_BLOCK, groups = k / group;
    memcpy(to_x->q + to * 2 * k, from_x->q + from * 2 * k, (size_t)(2 * k));
    memcpy(to_x->d + to * nb, from_x->d + from * nb, sizeof(float) * (size_t)nb);
    memcpy(to_x->gsum + to * groups, from_x->gsum + from * groups, sizeof(float) * (size_t)groups);
}

/* W4A16's chunk dot, the definition of the integer dot: each code against 256 xh + xl. */
static void chunk_dot_i16(const uint8_t *p, const int8_t *x_row, int64_t c,
                          int32_t dots[KH_TILE])
{
    const int8_t *xc = x_row + 16 * c;
    int32_t xv[8];
    int i;
    for (i = 0; i < 8; i++) xv[i] = (int32_t)xc[8 + i] * 256 + (uint8_t)xc[i];
    kh_chunk_dots(p, xv, dots);
}

/* The portable W4A16 kernel. */
static void tiles_i16_c(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,
                        const int32_t *xsum, int64_t r0, int mr, float *out)
{
    const KhTiles *w = tiles;
    (void)xsum;
    kh_tiles_portable(w, chunk_dot_i16, 2 * w->k, t0, nt, x, r0, mr, out);
}

KhTileKernel kh_tiles_i16_pick(int *mr_max)
{
    *mr_max = 4;
#if KH_HAVE_X86_SIMD
    switch (tiles_simd()) {
    case 3: return kh_tiles_i16_vnni512;
    case 1: return kh_tiles_i16_avx2;
    default: break;
    }
#endif
    return tiles_i16_c;
}
