/* kimi_gemv.c: fused INT4 unpack + dot products (see kimi_helper.h).
 *
 * Every weight byte is read once per call, for all rows of x. Per group g of a
 * weight row, y += s_g * dot(q_g, x_g) + m_g * sum(x_g); sum(x_g) is computed once
 * per call. A symmetric row (mins NULL) has m_g = -8 s_g, so its min term is
 * -8 * sum_g s_g * sum(x_g), computed from the scales. The code bytes hold elements 2j (low nibble) and 2j+1 (high nibble),
 * so x is de-interleaved once per call into blocks of 32: [x0 x2 .. x30 | x1 x3 .. x31];
 * a block of 16 code bytes then meets two contiguous runs of x.
 *
 * Paths: group % 32 == 0 uses the block kernels (AVX-512 or AVX2/FMA/F16C chosen at
 * run time on x86-64, else portable C the compiler vectorizes); any other even group
 * uses the plain scalar kernel on the raw x. */
#include "kimi_helper.h"
#include "kimi_simd.h"

#include <math.h>
#include <string.h>

#define BLOCK 32 /* elements per de-interleaved block = 16 code bytes */

/* xperm: [rows, k] de-interleaved per block (raw copy when group % 32 != 0);
 * xsum: [rows, k/group]. */
void kh_prepare_x(const float *x, int64_t rows, int64_t k, int64_t group,
                  float *xperm, float *xsum)
{
    int64_t groups = k / group, i;
    int blocked = group % BLOCK == 0;
    for (i = 0; i < rows * groups; i++) {
        int64_t r = i / groups, g = i % groups, j;
        const float *src = x + r * k + g * group;
        float *dst = xperm + r * k + g * group;
        float sum = 0.0f;
        for (j = 0; j < group; j++) sum += src[j];
        xsum[i] = sum;
        if (!blocked) {
            memcpy(dst, src, (size_t)group * sizeof *dst);
            continue;
        }
        for (j = 0; j < group; j += BLOCK) {
            int t;
            for (t = 0; t < BLOCK / 2; t++) {
                dst[j + t] = src[j + 2 * t];
                dst[j + BLOCK / 2 + t] = src[j + 2 * t + 1];
            }
        }
    }
}

/* Portable block kernel: one weight row against `rows` rows of de-interleaved x.
 * Each block of codes is converted (and scaled) once, then met by every row. */
static void row_blocks_c(const KhRow *w, const float *xperm, const float *xsum,
                         int64_t rows, float *y, int64_t y_stride)
{
    float acc[KH_MAX_ROWS][BLOCK / 2], even[BLOCK / 2], odd[BLOCK / 2];
    int64_t r, g, b, j, groups = w->k / w->group, blocks = w->group / BLOCK;
    memset(acc, 0, sizeof acc);
    for (g = 0; g < groups; g++) {
        float sc = kh_half_to_float(w->scales[g]);
        for (b = 0; b < blocks; b++) {
            int64_t blk = g * blocks + b;
            const uint8_t *q = w->q + blk * (BLOCK / 2);
            for (j = 0; j < BLOCK / 2; j++) {
                even[j] = sc * (float)(q[j] & 0x0f);
                odd[j] = sc * (float)(q[j] >> 4);
            }
            for (r = 0; r < rows; r++) {
                const float *xe = xperm + r * w->k + blk * BLOCK, *xo = xe + BLOCK / 2;
                for (j = 0; j < BLOCK / 2; j++) acc[r][j] += even[j] * xe[j] + odd[j] * xo[j];
            }
        }
    }
    for (r = 0; r < rows; r++) {
        float total = 0.0f;
        for (j = 0; j < BLOCK / 2; j++) total += acc[r][j];
        for (g = 0; g < groups; g++)
            total += kh_row_min(w, g) * xsum[r * groups + g];
        y[r * y_stride] = total;
    }
}

/* Scalar kernel for any even group, on raw (not de-interleaved) x. */
static void row_scalar(const KhRow *w, const float *x, const float *xsum,
                       int64_t rows, float *y, int64_t y_stride)
{
    int64_t r, g, j, groups = w->k / w->group;
    for (r = 0; r < rows; r++) {
        const float *xr = x + r * w->k;
        float total = 0.0f;
        for (g = 0; g < groups; g++) {
            const uint8_t *q = w->q + g * (w->group / 2);
            const float *xg = xr + g * w->group;
            float dot = 0.0f;
            for (j = 0; j < w->group / 2; j++)
                dot += (float)(q[j] & 0x0f) * xg[2 * j] + (float)(q[j] >> 4) * xg[2 * j + 1];
            total += kh_half_to_float(w->scales[g]) * dot
                     + kh_row_min(w, g) * xsum[r * groups + g];
        }
        y[r * y_stride] = total;
    }
}

static int simd_level = 2; /* highest kernel allowed: 0 portable C, 1 AVX2, 2 AVX-512 */

int gemv_simd(int mode)
{
    if (mode >= 0 && mode <= 2) simd_level = mode;
#if KH_HAVE_X86_SIMD
    if (simd_level >= 2 && kh_cpu_has_avx512()) return 2;
    if (simd_level >= 1 && kh_cpu_has_avx2()) return 1;
#endif
    return 0;
}

int kh_simd_cap(void)
{
    return simd_level;
}

KhRowFn kh_pick_row_fn(int64_t group)
{
    if (group % BLOCK) return row_scalar;
#if KH_HAVE_X86_SIMD
    switch (gemv_simd(-1)) {
    case 2: return kh_row_blocks_avx512;
    case 1: return kh_row_blocks_avx2;
    default: break;
    }
#endif
    return row_blocks_c;
}

int64_t gemv_w4a16_work_floats(int64_t rows, int64_t k, int64_t group)
{
    if (rows <= 0 || k <= 0 || group <= 0 || k % group) return -1;
    return rows * k + rows * (k / group);
}

static int check_shape(int64_t rows, int64_t n, int64_t k, int64_t group, int nthreads)
{
    if (rows <= 0 || rows > KH_MAX_ROWS || n <= 0 || k <= 0) return KH_EINVAL;
    if (group <= 0 || group % 2 || k % group || nthreads <= 0) return KH_EINVAL;
    return KH_OK;
}

/* One call's work, split into chunks of output rows for kh_parallel. Dense: output
 * row i is weight row i for all x rows. Routed: i = route * n + row of expert
 * expert_ids[route]; with swiglu, out = silu(gate row) * up row. */
typedef struct {
    KhRowFn row_fn;
    const uint8_t *q[2];
    const uint16_t *s[2], *m[2];
    const int64_t *expert_ids; /* NULL: dense */
    int swiglu;
    int64_t x_rows, n, k, group, total;
    const float *xperm, *xsum;
    float *out;
} GemvJob;

static void routed_row(const GemvJob *job, int64_t i)
{
    int64_t k = job->k, groups = k / job->group, route = i / job->n;
    int64_t xr = job->x_rows == 1 ? 0 : route;
    int64_t wrow = job->expert_ids[route] * job->n + i % job->n;
    const float *xp = job->xperm + xr * k, *xs = job->xsum + xr * groups;
    float v[2];
    int t;
    for (t = 0; t <= job->swiglu; t++) {
        KhRow w = kh_row(job->q[t], job->s[t], job->m[t], wrow, k, job->group);
        job->row_fn(&w, xp, xs, 1, &v[t], 1);
    }
    job->out[i] = job->swiglu ? v[0] / (1.0f + expf(-v[0])) * v[1] : v[0];
}

static void gemv_rows(void *ctx, int64_t i, int64_t end)
{
    const GemvJob *job = ctx;
    int64_t k = job->k, group = job->group; /* locals: k / group is computed once */
    for (; i < end; i++) {
        if (job->expert_ids) {
            routed_row(job, i);
        } else {
            KhRow w = kh_row(job->q[0], job->s[0], job->m[0], i, k, group);
            job->row_fn(&w, job->xperm, job->xsum, job->x_rows, job->out + i, job->n);
        }
    }
}

/* Prepares x, then runs every output row (kh_parallel_rows splits them). */
static int run_job(GemvJob *job, const float *x, float *work, int nthreads)
{
    float *xperm = work, *xsum = work + job->x_rows * job->k;
    kh_prepare_x(x, job->x_rows, job->k, job->group, xperm, xsum);
    job->xperm = xperm;
    job->xsum = xsum;
    job->row_fn = kh_pick_row_fn(job->group);
    kh_parallel_rows(gemv_rows, job, job->total, job->total * job->k * (job->swiglu + 1),
                     nthreads, 1);
    return KH_OK;
}

int gemv_w4a16(const float *x, int64_t rows, const uint8_t *qweight,
               const uint16_t *scales, const uint16_t *mins, int64_t n, int64_t k,
               int64_t group, float *work, float *out, int nthreads)
{
    GemvJob job = {.q = {qweight}, .s = {scales}, .m = {mins}, .x_rows = rows, .n = n,
                   .k = k, .group = group, .total = n, .out = out};
    int status = check_shape(rows, n, k, group, nthreads);
    if (status) return status;
    if (!x || !qweight || !scales || !work || !out) return KH_EINVAL;
    return run_job(&job, x, work, nthreads);
}

/* Shared checks of the MoE GEMVs: x has one row (every route reads it) or one per route. */
static int check_routes(const float *x, int64_t x_rows, const int64_t *expert_ids,
                        int64_t routes, int64_t num_experts)
{
    int64_t i;
    if (!x || !expert_ids || routes <= 0 || num_experts <= 0) return KH_EINVAL;
    if (x_rows != 1 && x_rows != routes) return KH_EINVAL;
    for (i = 0; i < routes; i++)
        if (expert_ids[i] < 0 || expert_ids[i] >= num_experts) return KH_EINVAL;
    return KH_OK;
}

/* The MoE GEMVs' job (1 stack, or 2 with the SwiGLU epilogue), checked, then run. */
static int run_routed(GemvJob *job, const float *x, int64_t routes, int64_t num_experts,
                      float *work, int nthreads)
{
    int t, status = check_shape(1, job->n, job->k, job->group, nthreads);
    if (!status) status = check_routes(x, job->x_rows, job->expert_ids, routes, num_experts);
    if (status) return status;
    for (t = 0; t <= job->swiglu; t++)
        if (!job->q[t] || !job->s[t]) return KH_EINVAL;
    if (!work || !job->out) return KH_EINVAL;
    job->total = routes * job->n;
    return run_job(job, x, work, nthreads);
}

int grouped_gemv_w4a16(const float *x, int64_t x_rows, const int64_t *expert_ids,
                       int64_t routes, int64_t num_experts, const uint8_t *qweight,
                       const uint16_t *scales, const uint16_t *mins, int64_t n, int64_t k,
                       int64_t group, float *work, float *out, int nthreads)
{
    GemvJob job = {.q = {qweight}, .s = {scales}, .m = {mins}, .expert_ids = expert_ids,
                   .x_rows = x_rows, .n = n, .k = k, .group = group, .out = out};
    return run_routed(&job, x, routes, num_experts, work, nthreads);
}

int moe_swiglu_w4a16(const float *x, int64_t x_rows, const int64_t *expert_ids,
                     int64_t routes, int64_t num_experts, const uint8_t *gate_q,
                     const uint16_t *gate_s, const uint16_t *gate_m, const uint8_t *up_q,
                     const uint16_t *up_s, const uint16_t *up_m, int64_t n, int64_t k,
                     int64_t group, float *work, float *out, int nthreads)
{
    GemvJob job = {.q = {gate_q, up_q}, .s = {gate_s, up_s}, .m = {gate_m, up_m}, .swiglu = 1,
                   .expert_ids = expert_ids, .x_rows = x_rows, .n = n, .k = k, .group = group,
                   .out = out};
    return run_routed(&job, x, routes, num_experts, work, nthreads);
}

/* Portable 16-bit-weight kernels (fp16, bf16): one weight row against every x row, 16
 * partial sums (the compiler vectorizes them), the same order whatever `rows` is. */
#define KH_H16_ROW_C(NAME, CVT)                                                            \
    static void NAME(const uint16_t *w, int64_t k, const float *x, int64_t rows, float *y,  \
                     int64_t y_stride)                                                     \
    {                                                                                      \
        int64_t r, j, l, main = k - k % 16;                                                \
        for (r = 0; r < rows; r++) {                                                       \
            const float *xr = x + r * k;                                                   \
            float acc[16] = {0}, total = 0.0f;                                             \
            for (j = 0; j < main; j += 16)                                                 \
                for (l = 0; l < 16; l++) acc[l] += CVT(w[j + l]) * xr[j + l];              \
            for (l = 0; l < 16; l++) total += acc[l];                                      \
            for (; j < k; j++) total += CVT(w[j]) * xr[j];                                 \
            y[r * y_stride] = total;                                                       \
        }                                                                                  \
    }

KH_H16_ROW_C(f16_row_c, kh_half_to_float)
KH_H16_ROW_C(bf16_row_c, kh_bf16_to_float)

typedef struct {
    const float *x;
    const uint16_t *w;
    int64_t rows, n, k;
    int level; /* gemv_simd(-1): 2 AVX-512, 1 AVX2, 0 portable */
    int is_bf16;
    float *out;
} F16Job;

static void f16_rows(void *ctx, int64_t i, int64_t end)
{
    const F16Job *job = ctx;
    int64_t k = job->k;
    if (job->is_bf16) { /* AVX2 also on AVX-512 machines */
#if KH_HAVE_X86_SIMD
        if (job->level >= 1)
            for (; i + 1 < end; i += 2)
                kh_bf16_rows_avx2(job->w + i * k, job->w + (i + 1) * k, k, job->x, job->rows,
                                  job->out + i, job->out + i + 1, job->n);
#endif
        for (; i < end; i++) bf16_row_c(job->w + i * k, k, job->x, job->rows, job->out + i, job->n);
        return;
    }
#if KH_HAVE_X86_SIMD
    if (job->level == 2) {
        for (; i + 1 < end; i += 2)
            kh_f16_rows_avx512(job->w + i * k, job->w + (i + 1) * k, k, job->x, job->rows,
                               job->out + i, job->out + i + 1, job->n);
    } else if (job->level == 1) {
        for (; i + 1 < end; i += 2)
            kh_f16_rows_avx2(job->w + i * k, job->w + (i + 1) * k, k, job->x, job->rows,
                             job->out + i, job->out + i + 1, job->n);
    }
#endif
    for (; i < end; i++) f16_row_c(job->w + i * k, k, job->x, job->rows, job->out + i, job->n);
}

static int gemv_h16(const float *x, int64_t rows, const uint16_t *w, int64_t n, int64_t k,
                    float *out, int nthreads, int is_bf16)
{
    F16Job job = {.x = x, .w = w, .rows = rows, .n = n, .k = k, .level = gemv_simd(-1),
                  .is_bf16 = is_bf16, .out = out};
    if (!x || !w || !out || rows <= 0 || n <= 0 || k <= 0 || nthreads <= 0) return KH_EINVAL;
    /* chunks of whole pairs of weight rows for the SIMD kernels */
    kh_parallel_rows(f16_rows, &job, n, n * k, nthreads, 2);
    return KH_OK;
}

int gemv_f16(const float *x, int64_t rows, const uint16_t *w, int64_t n, int64_t k,
             float *out, int nthreads)
{
    return gemv_h16(x, rows, w, n, k, out, nthreads, 0);
}

int gemv_bf16(const float *x, int64_t rows, const uint16_t *w, int64_t n, int64_t k,
              float *out, int nthreads)
{
    return gemv_h16(x, rows, w, n, k, out, nthreads, 1);
}
