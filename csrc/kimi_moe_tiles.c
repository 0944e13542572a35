/* kimi_moe_tiles.c: moe_grouped_w4a8 and moe_grouped_w4a16 on expert banks in the CPU's
 * tiles (KhInt4.tiled: each expert's [n, k] in tiles of 16 rows, kimi_tiles.h; expert e's
 * tiles are rows e n.. of the stack's). The routes, sums and silu are kimi_moe.c's
 * (kimi_moe_routes.c); the projections are tiles_w4a8's kernels, or W4A16's
 * (kimi_tiles_i16.c), one job item a (segment, matrix, tile): a thread's run of items
 * streams one matrix a tile at a time, 16 outputs per vector instruction.
 *
 * Why: the row-layout kernels (kimi_int8_body.h) spend two permutes, a convert and two FMAs
 * per x row and 64 inputs of one weight row; past ~40 GB/s they are bound by their
 * instructions, not the memory (bench/int4_kernels.py, AMD EPYC Zen 5: the layer at T = 1 read
 * 45-48 GB/s when the read probe did 77). A tile shares each instruction across 16 outputs.
 *
 * W4A8: x and h are quantized per route as tiles_w4a8 quantizes a row (kh_quantize_q8), and
 * where the kernel reads x interleaved (AVX-512 VNNI), a segment's rows lie in blocks of up to
 * mr_max rows from its first, which the kernel is handed whole. W4A16: rounded to int16 as
 * kimi_moe_i16.c rounds them (kh_tiles_i16_quantize), in natural order. The kernels compute each
 * output alike whatever the rows with it, so a token's result is the same bits whatever
 * tokens share the call, and the same at every tiles_simd level (kimi_tiles.h). */
#include "kimi_moe.h"
#include "kimi_tiles.h"

typedef struct {
    KhTileKernel kernel;
    int mr_max;
    const KhInt4 *w[2];                  /* gate and up; or down alone */
    int matrices;
    const int64_t *seg_expert, *seg_start;
    KhQ8 x;                              /* the prepared rows, in sorted order */
    int64_t tiles;                       /* per matrix */
    float *out[2];                       /* [R, n] each */
} TileJob;

/* Item (segment, matrix, tile): `tiles` items per matrix, the segment's matrices in turn. */
static void tile_items(void *ctx, int64_t i, int64_t end)
{
    const TileJob *job = ctx;
    for (; i < end; i++) {
        int64_t per_seg = job->tiles * job->matrices, seg = i / per_seg;
        const KhInt4 *w = job->w[i % per_seg / job->tiles];
        int64_t e = job->seg_expert[seg], at = e * w->n * (w->k / w->group), r0;
        KhTiles tw = {w->q + e * w->n * (w->k / 2), w->s + at, w->m ? w->m + at : NULL,
                      w->n, w->k, w->group};
        for (r0 = job->seg_start[seg]; r0 < job->seg_start[seg + 1]; r0 += job->mr_max) {
            int64_t left = job->seg_start[seg + 1] - r0;
            job->kernel(&tw, i % job->tiles, 1, &job->x, NULL, r0,
                        left < job->mr_max ? (int)left : job->mr_max,
                        job->out[i % per_seg / job->tiles]);
        }
    }
}

static void run_tiles(TileJob *job, int64_t segments, int nthreads)
{
    int64_t total;
    job->tiles = job->w[0]->n / KH_TILE;
    total = segments * job->tiles * job->matrices;
    kh_parallel_rows(tile_items, job, total, total * KH_TILE * job->w[0]->k, nthreads, 1);
}

/* Row r (sorted) of src's rows [R, k] (row `order`-mapped for x, itself for h) into q8: in
 * natural order, or as its lane of the block of up to mr_max rows from its segment's start. */
static void quantize_routes(const KhMoeRun *run, const float *src, int64_t k, int64_t top_k,
                            int interleaved, int mr_max, KhQ8 *q8)
{
    int64_t nb = k / KH_Q8_BLOCK, groups = k / run->group, s, r;
    for (s = 0; s < run->segments; s++)
        for (r = run->seg_start[s]; r < run->seg_start[s + 1]; r++) {
            const float *row = src + (top_k ? run->order[r] / top_k : r) * k;
            int64_t b0 = interleaved ? r - (r - run->seg_start[s]) % mr_max : r;
            int64_t mr = run->seg_start[s + 1] - b0 < mr_max ? run->seg_start[s + 1] - b0 : mr_max;
            KhQ8 at = {q8->q + b0 * k, q8->d + b0 * nb, q8->gsum + b0 * groups};
            if (interleaved && mr > 1)
                kh_quantize_q8_lane(row, k, run->group, mr, r - b0, &at, NULL);
            else /* natural order: the row at r (b0 == r, or a block of one) */
                kh_quantize_q8(row, 1, k, run->group, 0, &at);
        }
}

/* W4A16: row r (sorted) of src's rows into kh_tiles_i16_quantize's codes, natural order. h's
 * rows are rounded in place; x's once per token (into y, which the down projection fills only
 * later: its R d floats hold T <= R rows of d/2 + d/32 + d/group), then copied to each of its
 * routes (a token's 8 routes took 46 us of scalar rounding at Kimi's d, 2304, against ~770
 * for the whole layer). */
static void round_routes(const KhMoeRun *run, const float *src, int64_t k, int64_t top_k,
                         KhQ8 *x)
{
    int64_t r;
    KhQ8 tokens;
    if (!top_k) {
        for (r = 0; r < run->routes; r++) kh_tiles_i16_quantize(src + r * k, k, run->group, r, x);
        return;
    }
    tokens = kh_tiles_i16_at(run->y, run->routes / top_k, k, run->group);
    for (r = 0; r < run->routes / top_k; r++)
        kh_tiles_i16_quantize(src + r * k, k, run->group, r, &tokens);
    for (r = 0; r < run->routes; r++)
        kh_tiles_i16_copy(&tokens, run->order[r] / top_k, x, r, k, run->group);
}

/* The rows of src [.., k] that meet the weights, as the kernel reads them. */
static void prepare_routes(const KhMoeRun *run, const float *src, int64_t k, int64_t top_k,
                           int i16, int interleaved, int mr_max, KhQ8 *x)
{
    if (i16)
        round_routes(run, src, k, top_k, x);
    else
        quantize_routes(run, src, k, top_k, interleaved, mr_max, x);
}

int kh_moe_grouped_tiles(const KhExperts *bank, int i16, const float *x, int64_t tokens,
                         int64_t top_k, const int64_t *experts, const float *weights,
                         float *work, float *out, int nthreads)
{
    KhMoeFloats floats = i16 ? kh_tiles_i16_floats : kh_moe_w4a8.floats;
    KhQ8 (*at)(float *, int64_t, int64_t, int64_t) = i16 ? kh_tiles_i16_at : kh_q8_at;
    TileJob job;
    KhMoeRun run;
    KhQ8 hs;
    int interleaved = 0, status;
    if (!bank || bank->gate.n % KH_TILE || bank->down.n % KH_TILE
        || bank->gate.group % KH_Q8_BLOCK)
        return KH_EINVAL;
    status = kh_moe_begin(&run, floats, bank, x, tokens, top_k, experts, weights, work, out,
                          nthreads);
    if (status != KH_OK) return status;
    /* a segment's rows a kernel call: a decode token's 1, a verify step's or a batch's few */
    job.kernel = i16 ? kh_tiles_i16_pick(&job.mr_max)
                     : kh_tiles_pick(KH_MAX_ROWS, 0, &job.mr_max, &interleaved);
    job.seg_expert = run.seg_expert;
    job.seg_start = run.seg_start;
    job.x = at(run.xs, run.routes, run.d, run.group);
    prepare_routes(&run, x, run.d, top_k, i16, interleaved, job.mr_max, &job.x);
    /* h = x W1^T, u = x W3^T [routes, inner]; then h = silu(h) * u */
    job.matrices = 2, job.w[0] = &bank->gate, job.w[1] = &bank->up;
    job.out[0] = run.h, job.out[1] = run.u;
    run_tiles(&job, run.segments, nthreads);
    kh_moe_silu(&run, nthreads);
    /* y [routes, d] = h W2^T */
    hs = at(run.hs, run.routes, run.inner, run.group);
    prepare_routes(&run, run.h, run.inner, 0, i16, interleaved, job.mr_max, &hs);
    job.x = hs;
    job.matrices = 1, job.w[0] = &bank->down, job.out[0] = run.y;
    run_tiles(&job, run.segments, nthreads);
    kh_moe_combine(&run, tokens, top_k, weights, out);
    return KH_OK;
}
