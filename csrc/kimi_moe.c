/* kimi_moe.c: the multi-row grouped MoE (see kimi_helper.h, moe_grouped_w4a16 and _w4a8).
 *
 * The T*top_k routes are sorted by expert (a counting sort): segment s is the sorted routes
 * [seg_start[s], seg_start[s+1]), every one of which chose expert seg_expert[s]. Each weight
 * row of a selected expert is read once and met by all of the segment's rows, KH_MAX_ROWS at a
 * time, so T tokens that share an expert cost one pass over it, not T. Three jobs on the pool:
 * g = x W1^T and u = x W3^T [R, inner], one job over (segment, matrix, `quad` output rows);
 * h = silu(g) * u by route; y = h W2^T [R, d] over (segment, quad). Last, each token's
 * outputs are summed in choice order.
 * A job item meets one matrix, so a thread's run of items streams one expert's W1, or its W3,
 * not both at once. Items that took 4 rows of each in turn made the Kimi MoE layer at T = 1
 * slower (2 threads, Zen 5, interleaved runs): over 64 experts in C, W4A8 847-874 us against
 * 695-758; in bench/int4_kernels.py's call (256 experts), W4A16 975-994 us against 925-934.
 * Same operations, same bits.
 * The dot (KhMoeDot) says how the rows are prepared and met: W4A16 here, W4A8 in
 * kimi_moe_w4a8.c. Its kernels compute each row alike whatever their count, so a token's
 * result does not depend on the tokens batched with it. */
#include "kimi_moe.h"

#include <math.h>

typedef struct {
    const KhMoeDot *dot;
    const KhMoeRows *op;                 /* the prepared rows of this job */
    const KhInt4 *w[2];                  /* gate and up; or down alone */
    int matrices;                        /* 2 or 1 */
    const int64_t *seg_expert, *seg_start;
    int64_t n, quads;                    /* output rows; quads of them per matrix */
    float *out[2];                       /* [R, n] each: w[0]'s outputs, w[1]'s */
} SegJob;

/* Item (segment, matrix, quad): `quads` items per matrix, the segment's matrices in turn. */
static void seg_item(const SegJob *job, int64_t item)
{
    int quad = job->dot->quad, count, t;
    int64_t n = job->n, k = job->op->k, group = job->op->group, r0;
    int64_t per_seg = job->quads * job->matrices, seg = item / per_seg;
    int64_t m = item % per_seg / job->quads, row0 = item % job->quads * quad;
    const KhInt4 *w = job->w[m];
    KhRow rows[4];
    count = n - row0 < quad ? (int)(n - row0) : quad;
    for (t = 0; t < count; t++)
        rows[t] = kh_row(w->q, w->s, w->m, job->seg_expert[seg] * n + row0 + t, k, group);
    for (r0 = job->seg_start[seg]; r0 < job->seg_start[seg + 1]; r0 += KH_MAX_ROWS) {
        int64_t left = job->seg_start[seg + 1] - r0;
        job->dot->dots(job->op, rows, count, r0, left < KH_MAX_ROWS ? left : KH_MAX_ROWS,
                       job->out[m] + r0 * n + row0, n);
    }
}

static void seg_items(void *ctx, int64_t i, int64_t end)
{
    for (; i < end; i++) seg_item(ctx, i);
}

/* Every (segment, matrix, quad of output rows) of `segments` on the pool. */
static void run_segments(SegJob *job, int64_t segments, int nthreads)
{
    int64_t total;
    job->n = job->w[0]->n;
    job->quads = (job->n + job->dot->quad - 1) / job->dot->quad;
    total = segments * job->quads * job->matrices;
    kh_parallel_rows(seg_items, job, total, total * job->dot->quad * job->w[0]->k, nthreads, 1);
}

typedef struct {
    float *h;
    const float *u;
    int64_t inner;
} SiluJob;

/* h = silu(h) * u for routes [i, end): expf per value, the formula of moe_swiglu's C kernel
 * (kimi_gemv.c), so a decode token gets its bits. */
static void silu_routes(void *ctx, int64_t i, int64_t end)
{
    const SiluJob *job = ctx;
    int64_t j;
    for (j = i * job->inner; j < end * job->inner; j++) {
        float g = job->h[j];
        job->h[j] = g / (1.0f + expf(-g)) * job->u[j];
    }
}

/* A stable counting sort of experts [routes] by id into order [routes] (route indices,
 * expert-major), seg_expert and seg_start [segments + 1]; returns the segment count, or -1
 * for an id outside 0..num_experts-1. */
static int64_t sort_routes(const int64_t *experts, int64_t routes, int64_t num_experts,
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

/* out[t] = sum over choices c, in order, of weights[t, c] * y[sorted position of route
 * t * top_k + c]; y [routes, d] in sorted order, pos [routes] scratch. */
static void combine_routes(const float *y, const int64_t *order, int64_t *pos, int64_t tokens,
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

/* n floats rounded up to whole 64-byte lines: each part of the work starts on a line, so a
 * row kernel's 64-byte loads of x never straddle two (at 8 bytes past a line, the int64 part's
 * size at one route, they did: one MoE layer at T = 1 took 20% longer than the same rows'
 * routed GEMVs on an aligned x). */
static int64_t lines(int64_t n)
{
    return (n + 15) / 16 * 16;
}

/* Work layout, in floats, each part from a 64-byte line (the work is, as torch allocates):
 * int64 order [R], seg_expert [R], seg_start [R+1] (2 floats each); x prepared [R, d];
 * h [R, inner] (x W1^T, then silu of it times u); u [R, inner] (x W3^T); h prepared
 * [R, inner]; y [R, d]. */
typedef struct {
    int64_t xs, h, u, hs, y, total;  /* offsets of the parts, and the size */
} MoeWork;

static MoeWork moe_work(const KhMoeDot *dot, int64_t routes, int64_t d, int64_t inner,
                        int64_t group)
{
    MoeWork at = {.total = -1};
    int64_t xs = dot->floats(routes, d, group), hs = dot->floats(routes, inner, group);
    if (xs < 0 || hs < 0) return at;
    at.xs = lines(2 * (3 * routes + 1));
    at.h = at.xs + lines(xs);
    at.u = at.h + lines(routes * inner);
    at.hs = at.u + lines(routes * inner);
    at.y = at.hs + lines(hs);
    at.total = at.y + routes * d;
    return at;
}

int64_t kh_moe_work_floats(const KhMoeDot *dot, int64_t routes, int64_t d, int64_t inner,
                           int64_t group)
{
    if (routes <= 0 || d <= 0 || inner <= 0 || group <= 0 || d % group || inner % group) return -1;
    return moe_work(dot, routes, d, inner, group).total;
}

static int bank_ok(const KhExperts *bank)
{
    const KhInt4 *g = &bank->gate, *u = &bank->up, *dn = &bank->down;
    return g->q && g->s && u->q && u->s && dn->q && dn->s && bank->num_experts > 0
           && u->n == g->n && u->k == g->k && u->group == g->group
           && dn->n == g->k && dn->k == g->n && dn->group == g->group;
}

int kh_moe_grouped(const KhMoeDot *dot, const KhExperts *bank, const float *x, int64_t tokens,
                   int64_t top_k, const int64_t *experts, const float *weights, float *work,
                   float *out, int nthreads)
{
    SegJob job = {.dot = dot};
    int64_t routes = tokens * top_k, segments, r, d, inner, group;
    int64_t *order, *seg_expert, *seg_start;
    float *h, *u, *y;
    KhMoeRows xs, hs;
    SiluJob silu;
    MoeWork at;
    if (!bank || !bank_ok(bank) || !x || !experts || !weights || !work || !out || tokens <= 0
        || top_k <= 0 || nthreads <= 0)
        return KH_EINVAL;
    d = bank->gate.k, inner = bank->gate.n, group = bank->gate.group;
    if (kh_moe_work_floats(dot, routes, d, inner, group) < 0) return KH_EINVAL;
    at = moe_work(dot, routes, d, inner, group);
    order = (int64_t *)work;
    seg_expert = order + routes;
    seg_start = seg_expert + routes;
    xs = dot->at(work + at.xs, routes, d, group);
    h = work + at.h;
    u = work + at.u;
    hs = dot->at(work + at.hs, routes, inner, group);
    y = work + at.y;
    segments = sort_routes(experts, routes, bank->num_experts, order, seg_expert, seg_start);
    if (segments < 0) return KH_EINVAL;
    for (r = 0; r < routes; r++)             /* x row of each route, in expert order */
        dot->prepare(&xs, x + (order[r] / top_k) * d, r, 1);
    job.seg_expert = seg_expert;
    job.seg_start = seg_start;
    /* h = x W1^T, u = x W3^T [routes, inner]; then h = silu(h) * u */
    job.matrices = 2, job.w[0] = &bank->gate, job.w[1] = &bank->up, job.op = &xs;
    job.out[0] = h, job.out[1] = u;
    run_segments(&job, segments, nthreads);
    silu.h = h, silu.u = u, silu.inner = inner;
    kh_parallel_rows(silu_routes, &silu, routes, routes * inner, nthreads, 1);
    /* y [routes, d] = h W2^T */
    dot->prepare(&hs, h, 0, routes);
    job.matrices = 1, job.w[0] = &bank->down, job.op = &hs, job.out[0] = y;
    run_segments(&job, segments, nthreads);
    combine_routes(y, order, seg_expert, tokens, top_k, weights, d, out);
    return KH_OK;
}

/* W4A16: rows de-interleaved with their group sums (kh_prepare_x), 4 weight rows an item (one
 * row an item cost ~8%, measured when an item still took its rows of gate and of up). */
static int64_t w4a16_floats(int64_t rows, int64_t k, int64_t group)
{
    return rows * (k + k / group);
}

static KhMoeRows w4a16_at(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhMoeRows op = {.k = k, .group = group, .row_fn = kh_pick_row_fn(group),
                    .xperm = base, .xsum = base + rows * k};
    return op;
}

static void w4a16_prepare(const KhMoeRows *op, const float *src, int64_t row, int64_t count)
{
    int64_t groups = op->k / op->group;
    kh_prepare_x(src, count, op->k, op->group, op->xperm + row * op->k, op->xsum + row * groups);
}

static void w4a16_dots(const KhMoeRows *op, const KhRow *w, int count, int64_t r0, int64_t rows,
                       float *y, int64_t y_stride)
{
    int64_t groups = op->k / op->group;
    int t;
    for (t = 0; t < count; t++)
        op->row_fn(&w[t], op->xperm + r0 * op->k, op->xsum + r0 * groups, rows, y + t, y_stride);
}

static const KhMoeDot w4a16 = {4, w4a16_floats, w4a16_at, w4a16_prepare, w4a16_dots};

/* W4A16's dot for these shapes on this CPU, under the caps: the int16 one where it runs. */
static const KhMoeDot *w4a16_dot(int64_t d, int64_t inner, int64_t group)
{
    const KhMoeDot *i16 = kh_moe_i16_pick(d, inner, group);
    return i16 ? i16 : &w4a16;
}

int moe_grouped_w4a16_int16(int64_t d, int64_t inner, int64_t group)
{
    return kh_moe_i16_pick(d, inner, group) != 0;
}

/* Sized for the float dot whichever runs: its rows (k + k/group floats) are longer than the
 * int16 dot's (k/2 + k/32 + k/group), so a cap changed between sizing and the call cannot
 * overrun the work. */
int64_t moe_grouped_work_floats(int64_t routes, int64_t d, int64_t inner, int64_t group)
{
    return kh_moe_work_floats(&w4a16, routes, d, inner, group);
}

int64_t moe_grouped_w4a8_work_floats(int64_t routes, int64_t d, int64_t inner, int64_t group)
{
    return kh_moe_work_floats(&kh_moe_w4a8, routes, d, inner, group);
}

int moe_grouped_w4a16(const KhExperts *bank, const float *x, int64_t tokens, int64_t top_k,
                      const int64_t *experts, const float *weights, float *work, float *out,
                      int nthreads)
{
    if (!bank || bank->gate.group % 2) return KH_EINVAL;
    return kh_moe_grouped(w4a16_dot(bank->gate.k, bank->gate.n, bank->gate.group), bank, x,
                          tokens, top_k, experts, weights, work, out, nthreads);
}

int moe_grouped_w4a8(const KhExperts *bank, const float *x, int64_t tokens, int64_t top_k,
                     const int64_t *experts, const float *weights, float *work, float *out,
                     int nthreads)
{
    return kh_moe_grouped(&kh_moe_w4a8, bank, x, tokens, top_k, experts, weights, work, out,
                          nthreads);
}
