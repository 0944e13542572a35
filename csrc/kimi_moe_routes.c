/* kimi_moe_routes.c: the grouped MoE's steps around its dots, shared by the row-layout loop
 * (kimi_moe.c) and the tiles' (kimi_moe_tiles.c): the call's checks, the work's layout, the
 * routes sorted by expert, silu(h) * u, and each token's sum in choice order. */
#include "kimi_moe.h"

#include <math.h>

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

void kh_moe_silu(const KhMoeRun *run, int nthreads)
{
    SiluJob silu = {run->h, run->u, run->inner};
    kh_parallel_rows(silu_routes, &silu, run->routes, run->routes * run->inner, nthreads, 1);
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

void kh_moe_combine(const KhMoeRun *run, int64_t tokens, int64_t top_k, const float *weights,
                    float *out)
{
    int64_t routes = tokens * top_k, d = run->d, r, t, c, j;
    int64_t *pos = run->seg_expert; /* scratch now: the sorted position of each route */
    for (r = 0; r < routes; r++) pos[run->order[r]] = r;
    for (t = 0; t < tokens; t++) {
        float *o = out + t * d;
        for (j = 0; j < d; j++) o[j] = 0.0f;
        for (c = 0; c < top_k; c++) {
            const float *yr = run->y + pos[t * top_k + c] * d;
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

typedef struct {
    int64_t xs, h, u, hs, y, total; /* offsets of the parts (kimi_moe.h), and the size */
} MoeWork;

static MoeWork moe_work(KhMoeFloats floats, int64_t routes, int64_t d, int64_t inner,
                        int64_t group)
{
    MoeWork at = {.total = -1};
    int64_t xs = floats(routes, d, group), hs = floats(routes, inner, group);
    if (xs < 0 || hs < 0) return at;
    at.xs = lines(2 * (3 * routes + 1));
    at.h = at.xs + lines(xs);
    at.u = at.h + lines(routes * inner);
    at.hs = at.u + lines(routes * inner);
    at.y = at.hs + lines(hs);
    at.total = at.y + routes * d;
    return at;
}

int64_t kh_moe_work_floats(KhMoeFloats floats, int64_t routes, int64_t d, int64_t inner,
                           int64_t group)
{
    if (routes <= 0 || d <= 0 || inner <= 0 || group <= 0 || d % group || inner % group) return -1;
    return moe_work(floats, routes, d, inner, group).total;
}

static int bank_ok(const KhExperts *bank)
{
    const KhInt4 *g = &bank->gate, *u = &bank->up, *dn = &bank->down;
    return g->q && g->s && u->q && u->s && dn->q && dn->s && bank->num_experts > 0
           && u->n == g->n && u->k == g->k && u->group == g->group
           && dn->n == g->k && dn->k == g->n && dn->group == g->group;
}

int kh_moe_tiled(const KhExperts *bank)
{
    int tiled = !!bank->gate.tiled + !!bank->up.tiled + !!bank->down.tiled;
    return tiled == 3 ? 1 : tiled ? -1 : 0;
}

int kh_moe_begin(KhMoeRun *run, KhMoeFloats floats, const KhExperts *bank, const float *x,
                 int64_t tokens, int64_t top_k, const int64_t *experts, const float *weights,
                 float *work, float *out, int nthreads)
{
    MoeWork at;
    if (!bank || !bank_ok(bank) || !x || !experts || !weights || !work || !out || tokens <= 0
        || top_k <= 0 || nthreads <= 0)
        return KH_EINVAL;
    run->routes = tokens * top_k;
    run->d = bank->gate.k, run->inner = bank->gate.n, run->group = bank->gate.group;
    if (kh_moe_work_floats(floats, run->routes, run->d, run->inner, run->group) < 0)
        return KH_EINVAL;
    at = moe_work(floats, run->routes, run->d, run->inner, run->group);
    run->order = (int64_t *)work;
    run->seg_expert = run->order + run->routes;
    run->seg_start = run->seg_expert + run->routes;
    run->xs = work + at.xs, run->h = work + at.h, run->u = work + at.u;
    run->hs = work + at.hs, run->y = work + at.y;
    run->segments = sort_routes(experts, run->routes, bank->num_experts, run->order,
                                run->seg_expert, run->seg_start);
    return run->segments < 0 ? KH_EINVAL : KH_OK;
}
