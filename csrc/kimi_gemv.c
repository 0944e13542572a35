/* kimi_gemv.c: fused INT4 unpack + dot products (see kimi_helper.h).
 *
 * Every weight byte is read once per call, for all rows of x. Per group g of a
 * weight row, y += s_g * dot(q_g, x_g) + m_g * sum(x_g); sum(x_g) is computed once
 * per call. The code bytes hold elements 2j (low nibble) and 2j+1 (high nibble),
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
 * xsum: [rows, k/group]. Called inside the parallel region. */
static void prepare_x(const float *x, int64_t rows, int64_t k, int64_t group,
                      float *xperm, float *xsum)
{
    int64_t groups = k / group, i;
    int blocked = group % BLOCK == 0;
#pragma omp for schedule(static)
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

/* Portable block kernel: one weight row against `rows` rows of de-interleaved x. */
static void row_blocks_c(const KhRow *w, const float *xperm, const float *xsum,
                         int64_t rows, float *y, int64_t y_stride)
{
    int64_t r, g, b, j;
    int64_t groups = w->k / w->group, blocks = w->group / BLOCK;
    for (r = 0; r < rows; r++) {
        float acc[BLOCK / 2] = {0}, macc = 0.0f, total = 0.0f;
        const float *xr = xperm + r * w->k;
        for (g = 0; g < groups; g++) {
            float t[BLOCK / 2] = {0};
            float sc = kh_half_to_float(w->scales[g]);
            for (b = 0; b < blocks; b++) {
                const uint8_t *q = w->q + (g * blocks + b) * (BLOCK / 2);
                const float *xe = xr + (g * blocks + b) * BLOCK, *xo = xe + BLOCK / 2;
                for (j = 0; j < BLOCK / 2; j++)
                    t[j] += (float)(q[j] & 0x0f) * xe[j] + (float)(q[j] >> 4) * xo[j];
            }
            for (j = 0; j < BLOCK / 2; j++) acc[j] += sc * t[j];
            macc += kh_half_to_float(w->mins[g]) * xsum[r * groups + g];
        }
        for (j = 0; j < BLOCK / 2; j++) total += acc[j];
        y[r * y_stride] = total + macc;
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
                     + kh_half_to_float(w->mins[g]) * xsum[r * groups + g];
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

int gemv_w4a16(const float *x, int64_t rows, const uint8_t *qweight,
               const uint16_t *scales, const uint16_t *mins, int64_t n, int64_t k,
               int64_t group, float *work, float *out, int nthreads)
{
    float *xperm = work, *xsum = work + rows * k;
    KhRowFn row_fn;
    int status = check_shape(rows, n, k, group, nthreads);
    if (status) return status;
    if (!x || !qweight || !scales || !mins || !work || !out) return KH_EINVAL;
    row_fn = kh_pick_row_fn(group);
    if (n * k < KH_SERIAL_BELOW) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t i;
        prepare_x(x, rows, k, group, xperm, xsum);
#pragma omp for schedule(static)
        for (i = 0; i < n; i++) {
            KhRow w = {qweight + i * (k / 2), scales + i * (k / group),
                       mins + i * (k / group), k, group};
            row_fn(&w, xperm, xsum, rows, out + i, n);
        }
    }
    return KH_OK;
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

int grouped_gemv_w4a16(const float *x, int64_t x_rows, const int64_t *expert_ids,
                       int64_t routes, int64_t num_experts, const uint8_t *qweight,
                       const uint16_t *scales, const uint16_t *mins, int64_t n, int64_t k,
                       int64_t group, float *work, float *out, int nthreads)
{
    float *xperm = work, *xsum = work + x_rows * k;
    int64_t groups = k / (group > 0 ? group : 1);
    KhRowFn row_fn;
    int status = check_shape(1, n, k, group, nthreads);
    if (!status) status = check_routes(x, x_rows, expert_ids, routes, num_experts);
    if (status) return status;
    if (!qweight || !scales || !mins || !work || !out) return KH_EINVAL;
    row_fn = kh_pick_row_fn(group);
    if (routes * n * k < KH_SERIAL_BELOW) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t i;
        prepare_x(x, x_rows, k, group, xperm, xsum);
#pragma omp for schedule(static)
        for (i = 0; i < routes * n; i++) { /* output row i % n of route i / n */
            int64_t route = i / n, xr = x_rows == 1 ? 0 : route;
            int64_t wrow = expert_ids[route] * n + i % n;
            KhRow w = {qweight + wrow * (k / 2), scales + wrow * groups, mins + wrow * groups,
                       k, group};
            row_fn(&w, xperm + xr * k, xsum + xr * groups, 1, out + i, 1);
        }
    }
    return KH_OK;
}

int moe_swiglu_w4a16(const float *x, int64_t x_rows, const int64_t *expert_ids,
                     int64_t routes, int64_t num_experts, const uint8_t *gate_q,
                     const uint16_t *gate_s, const uint16_t *gate_m, const uint8_t *up_q,
                     const uint16_t *up_s, const uint16_t *up_m, int64_t n, int64_t k,
                     int64_t group, float *work, float *out, int nthreads)
{
    float *xperm = work, *xsum = work + x_rows * k;
    int64_t groups = k / (group > 0 ? group : 1);
    KhRowFn row_fn;
    int status = check_shape(1, n, k, group, nthreads);
    if (!status) status = check_routes(x, x_rows, expert_ids, routes, num_experts);
    if (status) return status;
    if (!gate_q || !gate_s || !gate_m || !up_q || !up_s || !up_m || !work || !out)
        return KH_EINVAL;
    row_fn = kh_pick_row_fn(group);
    if (2 * routes * n * k < KH_SERIAL_BELOW) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t i;
        prepare_x(x, x_rows, k, group, xperm, xsum);
#pragma omp for schedule(static)
        for (i = 0; i < routes * n; i++) {
            int64_t route = i / n, xr = x_rows == 1 ? 0 : route;
            int64_t wrow = expert_ids[route] * n + i % n;
            const float *xp = xperm + xr * k, *xs = xsum + xr * groups;
            KhRow g = {gate_q + wrow * (k / 2), gate_s + wrow * groups, gate_m + wrow * groups,
                       k, group};
            KhRow u = {up_q + wrow * (k / 2), up_s + wrow * groups, up_m + wrow * groups,
                       k, group};
            float gv, uv;
            row_fn(&g, xp, xs, 1, &gv, 1);
            row_fn(&u, xp, xs, 1, &uv, 1);
            out[i] = gv / (1.0f + expf(-gv)) * uv; /* silu(gate) * up */
        }
    }
    return KH_OK;
}
