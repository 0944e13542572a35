/* kimi_w4a8.c: the W4A8 GEMV, x quantized to int8 per block of 32 (see kimi_helper.h).
 *
 * Row r of x, block b of 32 elements: d = max|x| / 127 and xq = round(x * (1/d)), rounded
 * half away from zero into -127..127 (d = 0 and xq = 0 when d is below FLT_MIN: 1/d would
 * overflow). The codes are stored de-interleaved like the fp32 path's x,
 * [xq0 xq2 .. xq30 | xq1 xq3 .. xq31], so 16 code bytes (low nibbles = even elements) meet
 * 32 contiguous int8 values. Per weight row and group g:
 *     y += s_g * sum_b d_b * dot(q_b, xq_b) + m_g * gsum_g,  gsum_g = sum_b d_b * sum(xq_b)
 * The dots are exact int32; gsum is computed once per call (symmetric rows: m_g = -8 s_g).
 *
 * Kernels (w4a8_simd): AVX-512 VNNI or AVX-VNNI (kimi_w4a8_vnni.c) where k % 64 == 0, else
 * AVX2 (kimi_w4a8_avx2.c), or portable C; all but the portable one give the same bits. */
#include "kimi_helper.h"
#include "kimi_simd.h"

#include <float.h>
#include <string.h>

float kh_round_block(const float *src, int32_t limit, int keep_nan, int32_t *codes,
                     int32_t *sum)
{
    float amax, d, inv;
    int32_t bits[KH_Q8_BLOCK], top = 0, total = 0;
    int j;
    /* max |x| on the bits: without the sign, floats order as their bits (a NaN above all) */
    memcpy(bits, src, sizeof bits);
    for (j = 0; j < KH_Q8_BLOCK; j++) {
        int32_t a = bits[j] & 0x7fffffff;
        top = a > top ? a : top;
    }
    memcpy(&amax, &top, sizeof amax);
    d = amax / (float)limit;
    if (!(d >= FLT_MIN)) d = keep_nan && amax != amax ? amax : 0.0f; /* 1/d would overflow */
    inv = d > 0.0f ? 1.0f / d : 0.0f;
    for (j = 0; j < KH_Q8_BLOCK; j++) {
        float v = src[j] * inv;
        int32_t t;
        float frac;
        if (!(v == v)) v = 0.0f; /* a NaN or inf block (inv = 0): no NaN reaches the cast */
        t = (int32_t)v;          /* truncation; v - t is exact, so the tie test is too */
        frac = v - (float)t;
        t += (frac >= 0.5f) - (frac <= -0.5f);
        codes[j] = t > limit ? limit : (t < -limit ? -limit : t);
        total += codes[j];
    }
    *sum = total;
    return d;
}

/* One x row block -> its int8 codes (de-interleaved, or in natural order for Q8_0 weights);
 * returns d and stores sum(xq). */
static float quantize_block(const float *src, int8_t *dst, int32_t *sum, int deinterleave)
{
    int32_t q[KH_Q8_BLOCK];
    float d = kh_round_block(src, 127, 0, q, sum);
    int j;
    if (deinterleave) {
        for (j = 0; j < KH_Q8_BLOCK / 2; j++) {
            dst[j] = (int8_t)q[2 * j];
            dst[KH_Q8_BLOCK / 2 + j] = (int8_t)q[2 * j + 1];
        }
    } else {
        for (j = 0; j < KH_Q8_BLOCK; j++) dst[j] = (int8_t)q[j];
    }
    return d;
}

/* Blocks [0, nb) of src -> codes, d and sums at the highest level the caps allow (a level
 * above C: AVX2 is there): AVX-512 16 blocks at a time (the same bits), else one at a time. */
static void quantize_blocks(const float *src, int64_t nb, int8_t *dst, float *d, int32_t *sum,
                            int deinterleave)
{
    float (*block)(const float *, int8_t *, int32_t *, int) = quantize_block;
    int64_t b;
#if KH_HAVE_X86_SIMD
    int level = w4a8_simd(-1);
    if (level >= 3) {
        kh_quantize_blocks_avx512(src, nb, dst, d, sum, deinterleave);
        return;
    }
    if (level >= 1) block = kh_quantize_block_avx2;
#endif
    for (b = 0; b < nb; b++)
        d[b] = block(src + b * KH_Q8_BLOCK, dst + b * KH_Q8_BLOCK, sum + b, deinterleave);
}

#define KH_QUANTIZE_SPAN 64 /* blocks quantized at a time, into a buffer on the stack */

void kh_quantize_q8(const float *x, int64_t rows, int64_t k, int64_t group, int deinterleave,
                    KhQ8 *q8)
{
    int64_t nb = k / KH_Q8_BLOCK, per_group = group / KH_Q8_BLOCK, b0, b, g, in_group;
    int32_t sums[KH_QUANTIZE_SPAN];
    for (b0 = 0; b0 < rows * nb; b0 += KH_QUANTIZE_SPAN) {
        int64_t n = rows * nb - b0 < KH_QUANTIZE_SPAN ? rows * nb - b0 : KH_QUANTIZE_SPAN;
        quantize_blocks(x + b0 * KH_Q8_BLOCK, n, q8->q + b0 * KH_Q8_BLOCK, q8->d + b0, sums,
                        deinterleave);
        /* block b0 + b's group, counted along: a division a block was ~2% of a decode step */
        for (b = 0, g = b0 / per_group, in_group = b0 % per_group; b < n; b++) {
            if (in_group == 0) q8->gsum[g] = 0.0f;
            q8->gsum[g] += q8->d[b0 + b] * (float)sums[b];
            if (++in_group == per_group) in_group = 0, g++;
        }
    }
}

void kh_quantize_q8_lane(const float *x, int64_t k, int64_t group, int64_t mr, int64_t lane,
                         const KhQ8 *block, int32_t *sums)
{
    int64_t nb = k / KH_Q8_BLOCK, per_group = group / KH_Q8_BLOCK, b0, b, u, g, in_group;
    float *gsum = block->gsum + lane;
    for (b0 = 0; b0 < nb; b0 += KH_QUANTIZE_SPAN) {
        int64_t n = nb - b0 < KH_QUANTIZE_SPAN ? nb - b0 : KH_QUANTIZE_SPAN;
        int8_t codes[KH_QUANTIZE_SPAN * KH_Q8_BLOCK];
        int32_t sum[KH_QUANTIZE_SPAN];
        float d[KH_QUANTIZE_SPAN];
        quantize_blocks(x + b0 * KH_Q8_BLOCK, n, codes, d, sum, 0);
        for (b = b0, g = b0 / per_group, in_group = b0 % per_group; b < b0 + n; b++) {
            int8_t *to = block->q + (b * (KH_Q8_BLOCK / 8) * mr + lane) * 8;
            for (u = 0; u < KH_Q8_BLOCK / 8; u++)
                memcpy(to + u * mr * 8, codes + (b - b0) * KH_Q8_BLOCK + 8 * u, 8);
            block->d[b * mr + lane] = d[b - b0];
            if (sums) sums[b * mr + lane] = sum[b - b0];
            if (in_group == 0) gsum[g * mr] = 0.0f;
            gsum[g * mr] += d[b - b0] * (float)sum[b - b0];
            if (++in_group == per_group) in_group = 0, g++;
        }
    }
}

void kh_pair_q8(int8_t *codes, int64_t k)
{
    int64_t j;
    for (j = 0; j + 2 * KH_Q8_BLOCK <= k; j += 2 * KH_Q8_BLOCK) {
        int8_t odd[KH_Q8_BLOCK / 2];
        memcpy(odd, codes + j + 16, sizeof odd);
        memmove(codes + j + 16, codes + j + 32, 16);
        memcpy(codes + j + 32, odd, sizeof odd);
    }
}

/* Portable kernel: one weight row against `rows` quantized rows of x. */
static void q8_row_c(const KhRow *w, const KhQ8 *x, int64_t rows, float *y, int64_t y_stride)
{
    int64_t groups = w->k / w->group, nb = w->k / KH_Q8_BLOCK, per_group = w->group / KH_Q8_BLOCK;
    int64_t r, g, b;
    float acc[KH_MAX_ROWS] = {0};
    for (g = 0; g < groups; g++) {
        float s = kh_half_to_float(w->scales[g]);
        for (b = g * per_group; b < (g + 1) * per_group; b++) {
            const uint8_t *q = w->q + b * (KH_Q8_BLOCK / 2);
            int32_t lo[KH_Q8_BLOCK / 2], hi[KH_Q8_BLOCK / 2];
            int j;
            for (j = 0; j < KH_Q8_BLOCK / 2; j++) {
                lo[j] = q[j] & 0x0f;
                hi[j] = q[j] >> 4;
            }
            for (r = 0; r < rows; r++) {
                const int8_t *xe = x->q + r * w->k + b * KH_Q8_BLOCK;
                int32_t dot = 0;
                for (j = 0; j < KH_Q8_BLOCK / 2; j++)
                    dot += lo[j] * xe[j] + hi[j] * xe[KH_Q8_BLOCK / 2 + j];
                acc[r] += s * x->d[r * nb + b] * (float)dot;
            }
        }
    }
    for (r = 0; r < rows; r++) {
        float mins = 0.0f;
        for (g = 0; g < groups; g++) mins += kh_row_min(w, g) * x->gsum[r * groups + g];
        y[r * y_stride] = acc[r] + mins;
    }
}

static int int8_cap = 3; /* highest integer-dot kernel allowed: the levels of w4a8_simd */

int w4a8_simd(int mode)
{
    if (mode >= 0 && mode <= 3) int8_cap = mode;
#if KH_HAVE_X86_SIMD
    {
        int cap = int8_cap, wide = kh_simd_cap(); /* gemv_simd's 0 and 1 cap these too */
        if (wide < 2 && cap > wide) cap = wide;
        if (cap >= 3 && kh_cpu_has_avx512vnni()) return 3;
        if (cap >= 2 && kh_cpu_has_avxvnni()) return 2;
        if (cap >= 1 && kh_cpu_has_avx2()) return 1;
    }
#endif
    return 0;
}

const KhInt8Kernels *kh_int8_kernels(void)
{
#if KH_HAVE_X86_SIMD
    static const KhInt8Kernels sets[3] = {
        {kh_q8_rows4_avx2, kh_q8_pairs_avx2, kh_q8q8_row_avx2},
        {kh_q8_rows4_avxvnni, kh_q8_pairs_avxvnni, kh_q8q8_row_avxvnni},
        {kh_q8_rows4_vnni512, kh_q8_pairs_vnni512, kh_q8q8_row_vnni512},
    };
    int level = w4a8_simd(-1);
    if (level >= 1) return &sets[level - 1];
#endif
    return NULL;
}

int64_t gemv_w4a8_work_floats(int64_t rows, int64_t k, int64_t group)
{
    if (rows <= 0 || k <= 0 || group <= 0 || group % KH_Q8_BLOCK || k % group) return -1;
    return kh_q8_floats(rows, k, group);
}

int64_t kh_q8_floats(int64_t rows, int64_t k, int64_t group)
{
    return rows * (k / KH_Q8_BLOCK) + rows * (k / group) + rows * (k / 4);
}

KhQ8 kh_q8_at(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhQ8 q8;
    q8.d = base;
    q8.gsum = base + rows * (k / KH_Q8_BLOCK);
    q8.q = (int8_t *)(q8.gsum + rows * (k / group));
    return q8;
}

KhQ8Plan kh_q8_plan(int64_t k)
{
    KhQ8Plan plan;
    plan.kernels = kh_int8_kernels();
    plan.paired = plan.kernels && k % (2 * KH_Q8_BLOCK) == 0;
    return plan;
}

void kh_q8_prepare(const KhQ8Plan *plan, const float *x, int64_t rows, int64_t k,
                   int64_t group, KhQ8 *q8)
{
    int64_t r;
    kh_quantize_q8(x, rows, k, group, 1, q8);
    if (plan->paired)
        for (r = 0; r < rows; r++) kh_pair_q8(q8->q + r * k, k);
}

void kh_q8_dots(const KhQ8Plan *plan, const KhRow *w, int count, const KhQ8 *x, int64_t rows,
                float *y, int64_t y_stride)
{
    int t;
    if (plan->paired && rows == 1) { /* 4 weight rows per x load; a short count repeats */
        KhRow four[4];
        float y4[4];
        for (t = 0; t < 4; t++) four[t] = w[t < count ? t : count - 1];
        plan->kernels->rows4(four, x, y4);
        memcpy(y, y4, (size_t)count * sizeof *y4);
        return;
    }
    for (t = 0; t < count; t++) {
        if (plan->paired) /* the same operations per row as the 4-row kernel */
            plan->kernels->pairs(&w[t], x, rows, y + t, y_stride);
#if KH_HAVE_X86_SIMD
        else if (plan->kernels)
            kh_q8_row_avx2(&w[t], x, rows, y + t, y_stride);
#endif
        else
            q8_row_c(&w[t], x, rows, y + t, y_stride);
    }
}

typedef struct {
    KhQ8Plan plan;
    const uint8_t *q;
    const uint16_t *s, *m;
    KhQ8 x;
    int64_t rows, n, k, group;
    float *out;
} W4a8Job;

static void w4a8_rows(void *ctx, int64_t i, int64_t end)
{
    const W4a8Job *job = ctx;
    int64_t k = job->k, group = job->group; /* locals: k / group is computed once */
    for (; i < end; i += 4) {
        KhRow w[4];
        int t, count = end - i < 4 ? (int)(end - i) : 4;
        for (t = 0; t < count; t++) w[t] = kh_row(job->q, job->s, job->m, i + t, k, group);
        kh_q8_dots(&job->plan, w, count, &job->x, job->rows, job->out + i, job->n);
    }
}

int gemv_w4a8(const float *x, int64_t rows, const uint8_t *qweight, const uint16_t *scales,
              const uint16_t *mins, int64_t n, int64_t k, int64_t group, float *work,
              float *out, int nthreads)
{
    W4a8Job job = {.q = qweight, .s = scales, .m = mins, .rows = rows, .n = n, .k = k,
                   .group = group, .out = out};
    if (rows <= 0 || rows > KH_MAX_ROWS || n <= 0 || nthreads <= 0) return KH_EINVAL;
    if (gemv_w4a8_work_floats(rows, k, group) < 0) return KH_EINVAL;
    if (!x || !qweight || !scales || !work || !out) return KH_EINVAL;
    job.x = kh_q8_at(work, rows, k, group);
    job.plan = kh_q8_plan(k);
    kh_q8_prepare(&job.plan, x, rows, k, group, &job.x);
    kh_parallel_rows(w4a8_rows, &job, n, n * k, nthreads, job.plan.paired && rows == 1 ? 4 : 1);
    return KH_OK;
}
