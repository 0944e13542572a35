/* kimi_moe_w4a8.c: the multi-row grouped MoE with W4A8 projections (moe_grouped_w4a8, see
 * kimi_helper.h). The routes, segments and choice-order sums are moe_grouped_w4a16's
 * (kimi_moe.c); each route's x row, and each row of h, is quantized to int8 per block of 32
 * exactly as gemv_w4a8 quantizes (kh_q8_prepare), and the chosen experts' rows meet them
 * through gemv_w4a8's kernels (kh_q8_dots): a segment of one row (a decode token) takes 4
 * weight rows per x load, a longer one its rows 8 at a time. A job item is (segment, 4
 * output rows). The kernels and the quantization work per row, so a token's result is the
 * same bits whatever tokens share the call. */
#include "kimi_helper.h"
#include "kimi_simd.h"

#include <math.h>

typedef struct {
    KhQ8Plan plan;
    const uint8_t *q[2];
    const uint16_t *s[2], *m[2];
    int swiglu;                          /* phase 1: gate and up; phase 2: down */
    const int64_t *seg_expert, *seg_start;
    int64_t n, k, group, quads, total, per_chunk;
    KhQ8 x;                              /* one row per sorted route */
    float *out;                          /* [R, n] */
} SegQ8Job;

static void seg_quad(const SegQ8Job *job, int64_t item)
{
    int64_t k = job->k, groups = k / job->group, nb = k / KH_Q8_BLOCK;
    int64_t seg = item / job->quads, row0 = (item % job->quads) * 4, r0;
    int count = job->n - row0 < 4 ? (int)(job->n - row0) : 4, t, u;
    KhRow w[2][4];
    for (u = 0; u <= job->swiglu; u++)
        for (t = 0; t < count; t++) {
            int64_t wrow = job->seg_expert[seg] * job->n + row0 + t;
            KhRow one = {job->q[u] + wrow * (k / 2), job->s[u] + wrow * groups,
                         job->m[u] ? job->m[u] + wrow * groups : NULL, k, job->group};
            w[u][t] = one;
        }
    for (r0 = job->seg_start[seg]; r0 < job->seg_start[seg + 1]; r0 += KH_MAX_ROWS) {
        int64_t rows = job->seg_start[seg + 1] - r0, j;
        KhQ8 x = {job->x.q + r0 * k, job->x.d + r0 * nb, job->x.gsum + r0 * groups};
        float gate[KH_MAX_ROWS * 4], up[KH_MAX_ROWS * 4]; /* [rows, 4] */
        if (rows > KH_MAX_ROWS) rows = KH_MAX_ROWS;
        if (!job->swiglu) {
            kh_q8_dots(&job->plan, w[0], count, &x, rows, job->out + r0 * job->n + row0, job->n);
            continue;
        }
        kh_q8_dots(&job->plan, w[0], count, &x, rows, gate, 4);
        kh_q8_dots(&job->plan, w[1], count, &x, rows, up, 4);
        for (j = 0; j < rows; j++)
            for (t = 0; t < count; t++) {
                float g = gate[j * 4 + t];
                job->out[(r0 + j) * job->n + row0 + t] = g / (1.0f + expf(-g)) * up[j * 4 + t];
            }
    }
}

static void seg_chunk(void *ctx, int64_t chunk)
{
    const SegQ8Job *job = ctx;
    int64_t i = chunk * job->per_chunk, end = i + job->per_chunk;
    if (end > job->total) end = job->total;
    for (; i < end; i++) seg_quad(job, i);
}

static void run_segments(SegQ8Job *job, int64_t segments, int nthreads)
{
    job->quads = (job->n + 3) / 4;
    job->total = segments * job->quads;
    kh_parallel_rows(seg_chunk, job, job->total, job->total * 4 * job->k * (job->swiglu + 1),
                     nthreads, 1, &job->per_chunk);
}

/* Floats of one int8 row set [rows, k]: d, gsum, then the codes (k / 4 floats a row). */
static int64_t q8_floats(int64_t rows, int64_t k, int64_t group)
{
    return rows * (k / KH_Q8_BLOCK) + rows * (k / group) + rows * (k / 4);
}

static KhQ8 q8_at(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhQ8 q8;
    q8.d = base;
    q8.gsum = base + rows * (k / KH_Q8_BLOCK);
    q8.q = (int8_t *)(q8.gsum + rows * (k / group));
    return q8;
}

/* Work layout, in floats: int64 order [R], seg_expert [R], seg_start [R+1] (2 floats each);
 * x as int8 [R, d]; h [R, inner]; h as int8 [R, inner]; y [R, d]. */
int64_t moe_grouped_w4a8_work_floats(int64_t routes, int64_t d, int64_t inner, int64_t group)
{
    if (routes <= 0 || d <= 0 || inner <= 0 || group <= 0 || group % KH_Q8_BLOCK || d % group
        || inner % group)
        return -1;
    return 2 * (3 * routes + 1) + q8_floats(routes, d, group) + routes * inner
           + q8_floats(routes, inner, group) + routes * d;
}

int moe_grouped_w4a8(const float *x, int64_t tokens, int64_t top_k, const int64_t *experts,
                     const float *weights, int64_t num_experts,
                     const uint8_t *gate_q, const uint16_t *gate_s, const uint16_t *gate_m,
                     const uint8_t *up_q, const uint16_t *up_s, const uint16_t *up_m,
                     const uint8_t *down_q, const uint16_t *down_s, const uint16_t *down_m,
                     int64_t d, int64_t inner, int64_t group, float *work, float *out,
                     int nthreads)
{
    SegQ8Job job;
    int64_t routes = tokens * top_k, segments, r;
    int64_t *order, *seg_expert, *seg_start;
    float *h, *y;
    KhQ8 hq;
    if (!x || !experts || !weights || !gate_q || !gate_s || !up_q || !up_s || !down_q
        || !down_s || !work || !out || tokens <= 0 || top_k <= 0 || num_experts <= 0
        || nthreads <= 0 || moe_grouped_w4a8_work_floats(routes, d, inner, group) < 0)
        return KH_EINVAL;
    memset(&job, 0, sizeof job);
    order = (int64_t *)work;
    seg_expert = order + routes;
    seg_start = seg_expert + routes;
    job.x = q8_at(work + 2 * (3 * routes + 1), routes, d, group);
    h = work + 2 * (3 * routes + 1) + q8_floats(routes, d, group);
    hq = q8_at(h + routes * inner, routes, inner, group);
    y = h + routes * inner + q8_floats(routes, inner, group);
    segments = kh_sort_routes(experts, routes, num_experts, order, seg_expert, seg_start);
    if (segments < 0) return KH_EINVAL;
    job.plan = kh_q8_plan(d);
    for (r = 0; r < routes; r++) { /* x row of each route, in expert order */
        KhQ8 row = {job.x.q + r * d, job.x.d + r * (d / KH_Q8_BLOCK), job.x.gsum + r * (d / group)};
        kh_q8_prepare(&job.plan, x + (order[r] / top_k) * d, 1, d, group, &row);
    }
    job.seg_expert = seg_expert;
    job.seg_start = seg_start;
    job.group = group;
    /* phase 1: h [routes, inner] = silu(x W1^T) * (x W3^T) */
    job.swiglu = 1;
    job.q[0] = gate_q, job.s[0] = gate_s, job.m[0] = gate_m;
    job.q[1] = up_q, job.s[1] = up_s, job.m[1] = up_m;
    job.n = inner, job.k = d, job.out = h;
    run_segments(&job, segments, nthreads);
    /* phase 2: y [routes, d] = h W2^T */
    job.plan = kh_q8_plan(inner);
    kh_q8_prepare(&job.plan, h, routes, inner, group, &hq);
    job.x = hq;
    job.swiglu = 0;
    job.q[0] = down_q, job.s[0] = down_s, job.m[0] = down_m;
    job.n = d, job.k = inner, job.out = y;
    run_segments(&job, segments, nthreads);
    kh_combine_routes(y, order, seg_expert, tokens, top_k, weights, d, out);
    return KH_OK;
}
