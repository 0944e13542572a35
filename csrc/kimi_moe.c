/* kimi_moe.c: the multi-row grouped MoE (see kimi_helper.h, moe_grouped_w4a16).
 *
 * The T*top_k routes are sorted by expert (a counting sort): segment s is the sorted routes
 * [seg_start[s], seg_start[s+1]), every one of which chose expert seg_expert[s]. Each weight row of a selected expert is read
 * once and met by all of the segment's rows, KH_MAX_ROWS at a time, so T tokens that share an
 * expert cost one pass over it, not T. Two phases, each one kh_parallel job over (segment,
 * output row): h = silu(x W1^T) * (x W3^T) [R, inner], then y = h W2^T [R, d]. Last, each
 * token's outputs are summed in choice order, so a token's result does not depend on the
 * tokens batched with it (the row kernels compute each row alike whatever their count). */
#include "kimi_helper.h"
#include "kimi_simd.h"

#include <math.h>

typedef struct {
    KhRowFn row_fn;
    const uint8_t *q[2];
    const uint16_t *s[2], *m[2];
    int swiglu;                          /* phase 1: gate and up; phase 2: down */
    const int64_t *seg_expert, *seg_start;
    int64_t n, k, group, total, per_chunk;
    const float *xperm, *xsum;           /* [R, k], [R, k/group] */
    float *out;                          /* [R, n] */
} SegJob;

static void seg_row(const SegJob *job, int64_t i)
{
    int64_t k = job->k, groups = k / job->group, seg = i / job->n, row = i % job->n;
    int64_t wrow = job->seg_expert[seg] * job->n + row, r0, j, t;
    KhRow w[2];
    for (t = 0; t <= job->swiglu; t++) {
        KhRow one = {job->q[t] + wrow * (k / 2), job->s[t] + wrow * groups,
                     job->m[t] ? job->m[t] + wrow * groups : NULL, k, job->group};
        w[t] = one;
    }
    for (r0 = job->seg_start[seg]; r0 < job->seg_start[seg + 1]; r0 += KH_MAX_ROWS) {
        int64_t rows = job->seg_start[seg + 1] - r0;
        const float *xp = job->xperm + r0 * k, *xs = job->xsum + r0 * groups;
        float gate[KH_MAX_ROWS], up[KH_MAX_ROWS];
        if (rows > KH_MAX_ROWS) rows = KH_MAX_ROWS;
        if (!job->swiglu) {
            job->row_fn(&w[0], xp, xs, rows, job->out + r0 * job->n + row, job->n);
            continue;
        }
        job->row_fn(&w[0], xp, xs, rows, gate, 1);
        job->row_fn(&w[1], xp, xs, rows, up, 1);
        for (j = 0; j < rows; j++)
            job->out[(r0 + j) * job->n + row] = gate[j] / (1.0f + expf(-gate[j])) * up[j];
    }
}

static void seg_chunk(void *ctx, int64_t chunk)
{
    const SegJob *job = ctx;
    int64_t i = chunk * job->per_chunk, end = i + job->per_chunk;
    if (end > job->total) end = job->total;
    for (; i < end; i++) seg_row(job, i);
}

/* Runs the job's (segment, output row) pairs on the pool; xperm/xsum already prepared. */
static void run_segments(SegJob *job, int64_t segments, int nthreads)
{
    int64_t cost;
    job->row_fn = kh_pick_row_fn(job->group);
    job->total = segments * job->n;
    cost = job->total * job->k * (job->swiglu + 1);
    kh_parallel_rows(seg_chunk, job, job->total, cost, nthreads, 1, &job->per_chunk);
}

/* Work layout, in floats: int64 order [R], seg_expert [R], seg_start [R+1] (2 floats each);
 * xperm [R, d] + xsum [R, d/group]; h [R, inner]; hperm [R, inner] + hsum [R, inner/group];
 * y [R, d]. */
int64_t moe_grouped_work_floats(int64_t routes, int64_t d, int64_t inner, int64_t group)
{
    if (routes <= 0 || d <= 0 || inner <= 0 || group <= 0 || d % group || inner % group) return -1;
    return 2 * (3 * routes + 1) + routes * (d + d / group) + routes * inner
           + routes * (inner + inner / group) + routes * d;
}

int64_t kh_sort_routes(const int64_t *experts, int64_t routes, int64_t num_experts,
                           int64_t *order, int64_t *seg_expert, int64_t *seg_start)
{
    int64_t r, e, segments = 0, *next = seg_start; /* seg_start doubles as the counters */
    for (r = 0; r < routes; r++)
        if (experts[r] < 0 || experts[r] >= num_experts) return -1;
    /* pass 1: find the chosen experts in id order (seg_expert holds a flag per id first) */
    for (e = 0; e < routes; e++) seg_expert[e] = -1;
    for (r = 0; r < routes; r++) {
        for (e = 0; e < segments && seg_expert[e] != experts[r]; e++) {}
        if (e == segments) seg_expert[segments++] = experts[r];
    }
    /* insertion sort of the few chosen ids, then counts -> starts */
    for (e = 1; e < segments; e++) {
        int64_t v = seg_expert[e], j = e;
        for (; j > 0 && seg_expert[j - 1] > v; j--) seg_expert[j] = seg_expert[j - 1];
        seg_expert[j] = v;
    }
    for (e = 0; e <= segments; e++) next[e] = 0;
    for (r = 0; r < routes; r++) {
        for (e = 0; seg_expert[e] != experts[r]; e++) {}
        next[e + 1]++;
    }
    for (e = 0; e < segments; e++) next[e + 1] += next[e];
    for (r = 0; r < routes; r++) {           /* place, then shift the starts back */
        for (e = 0; seg_expert[e] != experts[r]; e++) {}
        order[next[e]++] = r;
    }
    for (e = segments; e > 0; e--) seg_start[e] = seg_start[e - 1];
    seg_start[0] = 0;
    return segments;
}

int moe_grouped_w4a16(const float *x, int64_t tokens, int64_t top_k, const int64_t *experts,
                      const float *weights, int64_t num_experts,
                      const uint8_t *gate_q, const uint16_t *gate_s, const uint16_t *gate_m,
                      const uint8_t *up_q, const uint16_t *up_s, const uint16_t *up_m,
                      const uint8_t *down_q, const uint16_t *down_s, const uint16_t *down_m,
                      int64_t d, int64_t inner, int64_t group, float *work, float *out,
                      int nthreads)
{
    SegJob job = {0};
    int64_t routes = tokens * top_k, segments, r;
    int64_t *order, *seg_expert, *seg_start;
    float *xperm, *xsum, *h, *hperm, *hsum, *y;
    if (!x || !experts || !weights || !gate_q || !gate_s || !up_q || !up_s || !down_q
        || !down_s || !work || !out || tokens <= 0 || top_k <= 0 || num_experts <= 0
        || group % 2 || nthreads <= 0 || moe_grouped_work_floats(routes, d, inner, group) < 0)
        return KH_EINVAL;
    order = (int64_t *)work;
    seg_expert = order + routes;
    seg_start = seg_expert + routes;
    xperm = work + 2 * (3 * routes + 1);
    xsum = xperm + routes * d;
    h = xsum + routes * (d / group);
    hperm = h + routes * inner;
    hsum = hperm + routes * inner;
    y = hsum + routes * (inner / group);
    segments = kh_sort_routes(experts, routes, num_experts, order, seg_expert, seg_start);
    if (segments < 0) return KH_EINVAL;
    for (r = 0; r < routes; r++)             /* x row of each route, in expert order */
        kh_prepare_x(x + (order[r] / top_k) * d, 1, d, group, xperm + r * d,
                     xsum + r * (d / group));
    job.seg_expert = seg_expert;
    job.seg_start = seg_start;
    job.group = group;
    /* phase 1: h [routes, inner] = silu(x W1^T) * (x W3^T) */
    job.swiglu = 1;
    job.q[0] = gate_q, job.s[0] = gate_s, job.m[0] = gate_m;
    job.q[1] = up_q, job.s[1] = up_s, job.m[1] = up_m;
    job.n = inner, job.k = d, job.xperm = xperm, job.xsum = xsum, job.out = h;
    run_segments(&job, segments, nthreads);
    /* phase 2: y [routes, d] = h W2^T */
    kh_prepare_x(h, routes, inner, group, hperm, hsum);
    job.swiglu = 0;
    job.q[0] = down_q, job.s[0] = down_s, job.m[0] = down_m;
    job.n = d, job.k = inner, job.xperm = hperm, job.xsum = hsum, job.out = y;
    run_segments(&job, segments, nthreads);
    kh_combine_routes(y, order, seg_expert, tokens, top_k, weights, d, out);
    return KH_OK;
}

void kh_combine_routes(const float *y, const int64_t *order, int64_t *pos, int64_t tokens,
                       int64_t top_k, const float *weights, int64_t d, float *out)
{
    int64_t routes = tokens * top_k, r, t, c, j;
    for (r = 0; r < routes; r++) pos[order[r]] = r;
    for (t = 0; t < tokens; t++) {
        float *o = out + t * d;
        for (j = 0; j < d; j++) o[j] = 0.0f;
        for (c = 0; c < top_k; c++) {
            const float *yr = y + pos[t * top_k + c] * d;
            float wt = weights[t * top_k + c];
            for (j = 0; j < d; j++) o[j] += wt * yr[j];
        }
    }
}
