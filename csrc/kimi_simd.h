/* Internal to the C helper (not exported): one weight row and the row kernels
 * that the GEMVs share. Not part of the cffi API. */
#ifndef KIMI_SIMD_H
#define KIMI_SIMD_H

#include <stdint.h>
#include <string.h>

#include "kimi_helper.h"         /* KH_MAX_ROWS and the status codes */

#ifndef KH_PREFETCH
#define KH_PREFETCH 2048         /* bytes of codes to prefetch ahead of the kernel */
#endif
#define KH_SCALE_CHUNK 64        /* scales converted to fp32 per batch in the kernels */
#define KH_SERIAL_BELOW 16384    /* n*k below this runs on one thread: fork/join costs more */
/* n*k from which waking sleeping helpers pays (~50 us of work): a SmolLM2-like layer
 * sequence ran 14 ms per step at 2 threads with 2**18, 11.7 ms with 2**20 (= 1 thread). */
#define KH_WAKE_WORTH (1 << 20)

/* -DKH_NO_X86_SIMD builds what a non-x86 machine gets: the portable kernels only. */
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) \
    && !defined(KH_NO_X86_SIMD)
#define KH_HAVE_X86_SIMD 1
#else
#define KH_HAVE_X86_SIMD 0
#endif

/* KERNEL(1) .. KERNEL(8): one row kernel per row count of x (a constant in each, so its row
 * loops unroll and the accumulators live in registers); KH_BY_ROWS(NAME) is the table of
 * NAME_1 .. NAME_8 by row count (entry 0 unused). */
#define KH_FOR_ROWS(KERNEL) \
    KERNEL(1) KERNEL(2) KERNEL(3) KERNEL(4) KERNEL(5) KERNEL(6) KERNEL(7) KERNEL(8)
#define KH_BY_ROWS(NAME) \
    {0, NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6, NAME##_7, NAME##_8}
#if KH_MAX_ROWS != 8
#error "KH_FOR_ROWS and KH_BY_ROWS list the row counts 1..8: KH_MAX_ROWS changed"
#endif

/* A symmetric group (no mins) is w = s*(q - 8) = s*q + (-8 s): its min, exactly. */
#define KH_SYMMETRIC_MIN(s) (-8.0f * (s))

/* One packed weight row: q [k/2] codes, scales and mins [k/group] half bits; mins is
 * NULL for a symmetric row. */
typedef struct {
    const uint8_t *q;
    const uint16_t *scales;
    const uint16_t *mins;
    int64_t k;
    int64_t group;
} KhRow;

/* Row `row` of a packed matrix [rows, k/2] (an expert stack counts rows across experts). A
 * loop over rows keeps k and group in locals, so that k / group is divided once. */
static inline KhRow kh_row(const uint8_t *q, const uint16_t *scales, const uint16_t *mins,
                           int64_t row, int64_t k, int64_t group)
{
    int64_t groups = k / group;
    KhRow w = {q + row * (k / 2), scales + row * groups, mins ? mins + row * groups : NULL, k,
               group};
    return w;
}

/* y[r * y_stride] = dot(w, x_r) for r < rows; xperm/xsum as prepared by the GEMV. */
typedef void (*KhRowFn)(const KhRow *w, const float *xperm, const float *xsum,
                        int64_t rows, float *y, int64_t y_stride);

KhRowFn kh_pick_row_fn(int64_t group);

/* gemv_simd's cap as set (0 portable C, 1 AVX2, 2 the widest), not capped by the CPU. */
int kh_simd_cap(void);

/* x quantized for the W4A8 GEMV (kimi_w4a8.c), per row r: q [k] int8 codes, de-interleaved
 * per block of KH_Q8_BLOCK; d [k/32] the blocks' scales; gsum [k/group] = sum over the
 * group's blocks of d * sum(q). Row strides k, k/32 and k/group. */
#define KH_Q8_BLOCK 32
typedef struct {
    int8_t *q;
    float *d;
    float *gsum;
} KhQ8;

/* One block of 32 values rounded to codes in -limit..limit (kimi_w4a8.c): d = max|x| / limit
 * (0 below FLT_MIN; with keep_nan a NaN max stays d, else 0), codes = x * (1/d) rounded half
 * away from zero (0 where that is NaN). Returns d; codes [32], *sum = their sum. W4A8 rounds
 * at 127, the int16 expert dots (kimi_moe_i16.c) at 32767. Plain loops, for the compiler to
 * vectorize. */
float kh_round_block(const float *src, int32_t limit, int keep_nan, int32_t *codes,
                     int32_t *sum);
/* x [rows, k] -> q8 (kimi_w4a8.c): per block of 32, d = max|x| / 127 and xq = x / d rounded
 * half away from zero; codes de-interleaved (the INT4 nibble order) or in natural order
 * (Q8_0 weights); gsum per group of `group` elements. */
void kh_quantize_q8(const float *x, int64_t rows, int64_t k, int64_t group, int deinterleave,
                    KhQ8 *q8);
/* One row x [k] quantized as kh_quantize_q8 quantizes it (natural order), as lane `lane` of a
 * block of mr rows in the tile kernels' interleaved layout (kimi_tiles.h): code j at
 * block->q[((j / 8) * mr + lane) * 8 + j % 8], d of block b at block->d[b * mr + lane], gsum of
 * group g at block->gsum[g * mr + lane], and the block's code sum at sums[b * mr + lane] unless
 * sums is NULL. */
void kh_quantize_q8_lane(const float *x, int64_t k, int64_t group, int64_t mr, int64_t lane,
                         const KhQ8 *block, int32_t *sums);
/* De-interleaved codes of one row [k] (k % 64 == 0) -> the pair layout in place: per pair of
 * blocks, [E_j O_j E_j+1 O_j+1] (16 bytes each) becomes [E_j E_j+1 O_j O_j+1]. */
void kh_pair_q8(int8_t *codes, int64_t k);

/* The integer-dot kernels that run under the caps (w4a8_simd's level), NULL for portable C. */
typedef struct {
    void (*rows4)(const KhRow *w, const KhQ8 *x, float *y);
    void (*pairs)(const KhRow *w, const KhQ8 *x, int64_t rows, float *y, int64_t y_stride);
    void (*q8q8)(const int8_t *w, const uint16_t *s, int64_t k, const KhQ8 *x, int64_t rows,
                 float *y, int64_t y_stride);
} KhInt8Kernels;
const KhInt8Kernels *kh_int8_kernels(void);

/* x [rows, k] -> xperm [rows, k] (de-interleaved per block of 32 when group % 32 == 0, else
 * a copy) and xsum [rows, k/group], the form every row kernel reads (kimi_gemv.c). */
void kh_prepare_x(const float *x, int64_t rows, int64_t k, int64_t group,
                  float *xperm, float *xsum);

/* The floats of x [rows, k] quantized: d, gsum, then the int8 codes (k / 4 floats a row);
 * kh_q8_at lays them out from base. */
int64_t kh_q8_floats(int64_t rows, int64_t k, int64_t group);
KhQ8 kh_q8_at(float *base, int64_t rows, int64_t k, int64_t group);

/* How gemv_w4a8 met its x (kimi_w4a8.c), shared with the grouped W4A8 MoE. */
typedef struct {
    const KhInt8Kernels *kernels; /* NULL: portable C */
    int paired;                   /* x codes in the pair layout: k % 64 == 0 and kernels */
} KhQ8Plan;
KhQ8Plan kh_q8_plan(int64_t k);
/* Quantizes x [rows, k] into q8 and puts its codes in the plan's layout. */
void kh_q8_prepare(const KhQ8Plan *plan, const float *x, int64_t rows, int64_t k,
                   int64_t group, KhQ8 *q8);
/* y[r * y_stride + t] = W4A8 dot(w[t], x row r) for count (1..4) weight rows of one linear
 * and rows (1..KH_MAX_ROWS) x rows: the 4-row kernel for one x row, else one weight row at a
 * time; the bits of (t, r) do not depend on count or rows. */
void kh_q8_dots(const KhQ8Plan *plan, const KhRow *w, int count, const KhQ8 *x, int64_t rows,
                float *y, int64_t y_stride);

/* Runs fn(ctx, c) for every chunk c < nchunks on the caller and up to nthreads-1
 * pool threads (kimi_pool.c); returns when all chunks are done. worth_waking: the
 * job is big enough to wake sleeping helpers (else only awake ones join). */
typedef void (*KhTask)(void *ctx, int64_t chunk);
void kh_parallel(KhTask fn, void *ctx, int64_t nchunks, int nthreads, int worth_waking);

/* fn(ctx, begin, end) for one share [begin, end) of a job's `total` output rows. */
typedef void (*KhRowsTask)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, total) in shares of per_chunk rows (the last one shorter) on the pool. */
void kh_parallel_split(KhRowsTask fn, void *ctx, int64_t total, int64_t per_chunk, int nthreads,
                       int worth_waking);

/* The GEMVs' split of `total` output rows: one thread when `cost` (weights touched) is below
 * KH_SERIAL_BELOW, else shares of at least 8 rows, about 8 per thread so a helper that starts
 * late still finds work (2 under kh_wake_all: fewer contended claims), rounded up to a
 * multiple of `multiple` (kernels that take weight rows in groups); sleeping helpers are
 * woken from KH_WAKE_WORTH on. */
void kh_parallel_rows(KhRowsTask fn, void *ctx, int64_t total, int64_t cost, int nthreads,
                      int64_t multiple);

/* While on (per calling thread), every job of kh_parallel_rows wakes sleeping helpers, as
 * one that is part of a larger unit of work (a whole decoder layer) should; returns the
 * previous setting. */
int kh_wake_all(int on);

/* Decode attention over fp16 caches (kimi_attn.c), for llama_decode_layer: row r's rotated
 * queries [heads, head_dim] at q + r * q_stride see row r's cache rows 0..positions[r]
 * (k_cache[r], v_cache[r]: [S_max, kv_heads, head_dim] fp16); out [rows, heads * head_dim].
 * work: kh_attention_work_floats floats. heads / kv_heads <= KH_ATTN_MAX_GROUP and
 * head_dim <= KH_ATTN_MAX_DIM (the caller checks). */
#define KH_ATTN_MAX_GROUP 16  /* query heads per KV head */
#define KH_ATTN_MAX_DIM 256   /* head_dim */
typedef struct {
    int64_t rows, heads, kv_heads, head_dim, q_stride;
    const float *q;
    uint16_t *const *k_cache, *const *v_cache;
    const int64_t *positions;
    float *out;
} KhAttention;
int64_t kh_attention_work_floats(int64_t rows, int64_t heads, int64_t head_dim);
void kh_attention(const KhAttention *a, float *work, int nthreads);
/* The tasks kh_attention would run these rows as, on nthreads (-1: bad rows or threads). */
int64_t kh_attention_tasks(const KhAttention *a, int nthreads);
/* act[i] = silu(g[i]) * u[i] for i < n, at gemv_simd's level (kimi_act.c). */
void kh_silu_mul(const float *g, const float *u, int64_t n, float *act);
/* The Llama layer call's other row-wise work (kimi_act.c), the same bits at every level:
 * y = x / sqrt(mean(x^2) + eps) * w over d; rotate-half RoPE on `heads` heads of hd in place
 * (sin's first half negated); x[i] += y[i] for i < n. */
void kh_rms_norm(const float *x, const float *w, int64_t d, float eps, float *y);
void kh_rope(float *x, int64_t heads, int64_t hd, const float *cos, const float *sin);
void kh_add(float *x, const float *y, int64_t n);

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

/* The sum of 8 floats (AVX2), shared by the AVX2 kernels. */
static __attribute__((target("avx2,fma,f16c"))) inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp on the lanes of VF: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-6 polynomial (the
 * Cephes expf coefficients: about 1 ulp), times 2^n built in the exponent bits. Inputs are
 * clamped to the fp32 range first (exp(-inf) comes out 0 after the scaling). One text for
 * each width (P: the intrinsics' prefix), so that a lane's operations, and bits, are the same
 * in each: kh_exp256 here, 16 lanes in kimi_attn_avx512.c. */
#define KH_EXP_FN(NAME, TARGET, VF, VI, P, ROUND, INT_AS_FLOAT)                                \
    static TARGET inline VF NAME(VF x)                                                         \
    {                                                                                          \
        const VF hi = P##set1_ps(88.3762626647949f), lo = P##set1_ps(-87.3365447504f);         \
        VF n, r, y;                                                                            \
        VI e;                                                                                  \
        x = P##max_ps(P##min_ps(x, hi), lo);                                                   \
        n = ROUND(P##mul_ps(x, P##set1_ps(1.44269504088896341f)),                              \
                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                              \
        r = P##fnmadd_ps(n, P##set1_ps(0.693359375f), x);                                      \
        r = P##fnmadd_ps(n, P##set1_ps(-2.12194440e-4f), r);                                   \
        y = P##set1_ps(1.9875691500e-4f);                                                      \
        y = P##fmadd_ps(y, r, P##set1_ps(1.3981999507e-3f));                                   \
        y = P##fmadd_ps(y, r, P##set1_ps(8.3334519073e-3f));                                   \
        y = P##fmadd_ps(y, r, P##set1_ps(4.1665795894e-2f));                                   \
        y = P##fmadd_ps(y, r, P##set1_ps(1.6666665459e-1f));                                   \
        y = P##fmadd_ps(y, r, P##set1_ps(5.0000001201e-1f));                                   \
        y = P##fmadd_ps(y, P##mul_ps(r, r), P##add_ps(r, P##set1_ps(1.0f)));                   \
        e = P##slli_epi32(P##add_epi32(P##cvtps_epi32(n), P##set1_epi32(127)), 23);            \
        return P##mul_ps(y, INT_AS_FLOAT(e));                                                  \
    }
KH_EXP_FN(kh_exp256, __attribute__((target("avx2,fma,f16c"))), __m256, __m256i, _mm256_,
          _mm256_round_ps, _mm256_castsi256_ps)

/* sum_g h[g] * v[g] for fp16 h (a row's mins, or its scales when symmetric), AVX2. */
float kh_halves_dot_avx2(const uint16_t *h, const float *v, int64_t n);
int kh_cpu_has_avx2(void);
void kh_row_blocks_avx2(const KhRow *w, const float *xperm, const float *xsum,
                        int64_t rows, float *y, int64_t y_stride);
/* y[r * y_stride] = W4A8 dot(w, x row r) for r < rows (1..KH_MAX_ROWS), group % 32 == 0. */
void kh_q8_row_avx2(const KhRow *w, const KhQ8 *x, int64_t rows, float *y, int64_t y_stride);
/* One block of 32 floats -> its int8 codes, as kimi_w4a8.c quantizes them (same bits). */
float kh_quantize_block_avx2(const float *src, int8_t *dst, int32_t *sum, int deinterleave);
/* The largest |x| of a block of 32 floats as its bits (a NaN above every number). */
int32_t kh_block_top_avx2(const float *src);
/* The same on AVX-512 (kimi_w4a8_vnni.c; w4a8_simd's level 3). */
float kh_quantize_block_avx512(const float *src, int8_t *dst, int32_t *sum, int deinterleave);
/* Blocks [0, nb) of src, each as kh_quantize_block_avx512 quantizes it: codes to dst, d[b],
 * sum[b]. */
void kh_quantize_blocks_avx512(const float *src, int64_t nb, int8_t *dst, float *d, int32_t *sum,
                               int deinterleave);
/* The integer-dot kernels of one instruction set (kimi_int8_body.h; suffixes _avx2,
 * _avxvnni, _vnni512), the same bits from every set:
 * rows4: y[i] = W4A8 dot(w[i], x row 0) for 4 weight rows of one linear (decode at one row),
 *   x's codes in the pair layout of kh_pair_q8; k % 64 == 0.
 * pairs: the same for one weight row against rows (1..KH_MAX_ROWS) x rows in the pair layout,
 *   by the same operations per (weight row, x row): batch-independent results.
 * q8q8: Q8_0 weights (int8, an fp16 scale per 32; kimi_q8.c) against x quantized in natural
 *   order, rows 1..KH_MAX_ROWS. */
#define KH_INT8_KERNELS(SUFFIX)                                                            \
    void kh_q8_rows4_##SUFFIX(const KhRow *w, const KhQ8 *x, float *y);                   \
    void kh_q8_pairs_##SUFFIX(const KhRow *w, const KhQ8 *x, int64_t rows, float *y,       \
                              int64_t y_stride);                                           \
    void kh_q8q8_row_##SUFFIX(const int8_t *w, const uint16_t *s, int64_t k, const KhQ8 *x, \
                              int64_t rows, float *y, int64_t y_stride);
KH_INT8_KERNELS(avx2)
KH_INT8_KERNELS(avxvnni)
KH_INT8_KERNELS(vnni512)
int kh_cpu_has_avxvnni(void);
int kh_cpu_has_avx512vnni(void); /* with AVX-512 F, BW and VL */
/* y[r * y_stride] = dot(w row, x row r) for two fp16 weight rows w0, w1 (y1 for w1). */
void kh_f16_rows_avx2(const uint16_t *w0, const uint16_t *w1, int64_t k, const float *x,
                      int64_t rows, float *y0, float *y1, int64_t y_stride);
/* The same for two bfloat16 weight rows. */
void kh_bf16_rows_avx2(const uint16_t *w0, const uint16_t *w1, int64_t k, const float *x,
                       int64_t rows, float *y0, float *y1, int64_t y_stride);
int kh_cpu_has_avx512(void);
/* y[r * y_stride] = dot(w row, x row r) for two fp16 weight rows w0, w1 (y1 for w1). */
void kh_f16_rows_avx512(const uint16_t *w0, const uint16_t *w1, int64_t k, const float *x,
                        int64_t rows, float *y0, float *y1, int64_t y_stride);
void kh_row_blocks_avx512(const KhRow *w, const float *xperm, const float *xsum,
                          int64_t rows, float *y, int64_t y_stride);
float kh_halves_dot_avx512(const uint16_t *h, const float *v, int64_t n);
#endif

/* IEEE 754 binary16 bits -> float, exact for every input (incl. subnormals). */
static inline float kh_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while ((man & 0x400u) == 0);
            man &= 0x3ffu;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* bfloat16 bits (the high half of an fp32) -> float, exact. */
static inline float kh_bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The min of group g of a row: stored (asymmetric) or -8 s (symmetric, mins NULL). */
static inline float kh_row_min(const KhRow *w, int64_t g)
{
    return w->mins ? kh_half_to_float(w->mins[g])
                   : KH_SYMMETRIC_MIN(kh_half_to_float(w->scales[g]));
}

#endif
