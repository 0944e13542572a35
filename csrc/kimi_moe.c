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

int kh_moe_grouped(const KhMoeDot *dot, const KhExperts *bank, const float *x, int64_t tokens,
                   int64_t top_k, const int64_t *experts, const float *weights, float *work,
                   float *out, int nthreads)
{
    SegJob job = {.dot = dot};
    KhMoeRun run;
    KhMoeRows xs, hs;
    int64_t r;
    int status = kh_moe_begin(&run, dot->floats, bank, x, tokens, top_k, experts, weights, work,
                              out, nthreads);
    if (status != KH_OK) return status;
    xs = dot->at(run.xs, run.routes, run.d, run.group);
    hs = dot->at(run.hs, run.routes, run.inner, run.group);
    for (r = 0; r < run.routes; r++)         /* x row of each route, in expert order */
        dot->prepare(&xs, x + (run.order[r] / top_k) * run.d, r, 1);
    job.seg_expert = run.seg_expert;
    job.seg_start = run.seg_start;
    /* h = x W1^T, u = x W3^T [routes, inner]; then h = silu(h) * u */
    job.matrices = 2, job.w[0] = &bank->gate, job.w[1] = &bank->up, job.op = &xs;
    job.out[0] = run.h, job.out[1] = run.u;
    run_segments(&job, run.segments, nthreads);
    kh_moe_silu(&run, nthreads);
    /* y [routes, d] = h W2^T */
    dot->prepare(&hs, run.h, 0, run.routes);
    job.matrices = 1, job.w[0] = &bank->down, job.op = &hs, job.out[0] = run.y;
    run_segments(&job, run.segments, nthreads);
    kh_moe_combine(&run, tokens, top_k, weights, out);
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
    return kh_moe_work_floats(w4a16_floats, routes, d, inner, group);
}

int64_t moe_grouped_w4a8_work_floats(int64_t routes, int64_t d, int64_t inner, int64_t group)
{
    return kh_moe_work_floats(kh_moe_w4a8.floats, routes, d, inner, group);
}

int moe_grouped_w4a16(const KhExperts *bank, const float *x, int64_t tokens, int64_t top_k,
                      const int64_t *experts, const float *weights, float *work, float *out,
                      int nthreads)
{
    if (bank && kh_moe_tiled(bank)) /* 1 for all three, or -1: KH_EINVAL */
        return kh_moe_tiled(bank) > 0 ? kh_moe_grouped_tiles(bank, 1, x, tokens, top_k, experts,
                                                             weights, work, out, nthreads)
                                      : KH_EINVAL;
    if (!bank || bank->gate.group % 2) return KH_EINVAL;
    return kh_moe_grouped(w4a16_dot(bank->gate.k, bank->gate.n, bank->gate.group), bank, x,
                          tokens, top_k, experts, weights, work, out, nthreads);
}

int moe_grouped_w4a8(const KhExperts *bank, const float *x, int64_t tokens, int64_t top_k,
                     const int64_t *experts, const float *weights, float *work, float *out,
                     int nthreads)
{
    if (bank && kh_moe_tiled(bank)) /* 1 for all three, or -1: KH_EINVAL */
        return kh_moe_tiled(bank) > 0 ? kh_moe_grouped_tiles(bank, 0, x, tokens, top_k, experts,
                                                             weights, work, out, nthreads)
                                      : KH_EINVAL;
    return kh_moe_grouped(&kh_moe_w4a8, bank, x, tokens, top_k, experts, weights, work, out,
                          nthreads);
}
