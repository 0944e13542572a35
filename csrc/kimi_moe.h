/* Internal to the C helper (not exported): the grouped MoE's one loop (kimi_moe.c), and the
 * dots it is run with: W4A16 (kimi_moe.c) and W4A8 (kimi_moe_w4a8.c). */
#ifndef KIMI_MOE_H
#define KIMI_MOE_H

#include "kimi_helper.h"
#include "kimi_simd.h"

/* Rows rounded to int16 per block of 32 (kimi_moe_i16.c), per row: q [k] codes in the pair
 * or planes layout (the kernel set's), d [k/32] the blocks' scales, gsum [k/group] = sum over a group's blocks of d sum(q). */
typedef struct {
    int16_t *q;
    float *d, *gsum;
} KhI16;

/* The int16-dot kernels of one instruction set (kimi_i16_body.h): rows4 meets one x row with
 * 4 weight rows; rows meets 1..KH_MAX_ROWS x rows with one weight row, by the same operations
 * per pair of rows. */
typedef struct {
    void (*rows4)(const KhRow *w, const KhI16 *x, float *y);
    void (*rows)(const KhRow *w, const KhI16 *x, int64_t rows, float *y, int64_t y_stride);
    int planes; /* x codes in the planes layout (AVX2's set), else the pair layout */
} KhI16Kernels;
void kh_i16_rows4_vnni512(const KhRow *w, const KhI16 *x, float *y);
void kh_i16_rows_vnni512(const KhRow *w, const KhI16 *x, int64_t rows, float *y,
                         int64_t y_stride);
void kh_i16_rows4_avx2(const KhRow *w, const KhI16 *x, float *y);
void kh_i16_rows_avx2(const KhRow *w, const KhI16 *x, int64_t rows, float *y, int64_t y_stride);

/* The rows one job's weights meet (x, then h), one per sorted route, as a dot prepared
 * them: de-interleaved with group sums (W4A16's float kernels), or quantized per block of 32
 * (W4A8; W4A16 at 16 bits where int16 dots run). */
typedef struct {
    int64_t k, group;
    KhRowFn row_fn;
    float *xperm, *xsum;    /* W4A16: [rows, k], [rows, k/group] */
    KhQ8Plan plan;
    KhQ8 q8;                /* W4A8 */
    KhI16 i16;              /* W4A16 as int16 dots */
    KhI16Kernels i16k;
} KhMoeRows;

typedef struct {
    int quad;               /* weight rows a job item takes (both dots: 4) */
    /* floats of `rows` prepared rows of width k in the work buffer; -1: a refused shape */
    int64_t (*floats)(int64_t rows, int64_t k, int64_t group);
    /* lays `rows` prepared rows out from base, for rows of width k */
    KhMoeRows (*at)(float *base, int64_t rows, int64_t k, int64_t group);
    /* src [count, k] -> prepared rows row..row+count-1 */
    void (*prepare)(const KhMoeRows *op, const float *src, int64_t row, int64_t count);
    /* y[r * y_stride + t] = dot(w[t], prepared row r0 + r) for t < count, r < rows */
    void (*dots)(const KhMoeRows *op, const KhRow *w, int count, int64_t r0, int64_t rows,
                 float *y, int64_t y_stride);
} KhMoeDot;

/* W4A8's dot (kimi_moe_w4a8.c): x and h quantized per block of 32, integer dots. */
extern const KhMoeDot kh_moe_w4a8;
/* W4A16's integer dot (kimi_moe_i16.c): x and h rounded to int16 per block of 32, for these
 * shapes under the caps (its comment says where), or NULL: W4A16 takes the float kernels. */
const KhMoeDot *kh_moe_i16_pick(int64_t d, int64_t inner, int64_t group); /* NULL: float */

/* moe_grouped_w4a16 / moe_grouped_w4a8 (kimi_helper.h) with the given dot. */
int kh_moe_grouped(const KhMoeDot *dot, const KhExperts *e, const float *x, int64_t tokens,
                   int64_t top_k, const int64_t *experts, const float *weights, float *work,
                   float *out, int nthreads);
/* moe_grouped_w4a8, or moe_grouped_w4a16 (i16), on banks in the CPU's tiles
 * (kimi_moe_tiles.c). */
int kh_moe_grouped_tiles(const KhExperts *e, int i16, const float *x, int64_t tokens,
                         int64_t top_k, const int64_t *experts, const float *weights,
                         float *work, float *out, int nthreads);

/* The steps both loops share (kimi_moe_routes.c). A call's routes sorted by expert, and its
 * work's parts (each from a 64-byte line): int64 order [R], seg_expert [R], seg_start [R+1];
 * x prepared; h [R, inner] (x W1^T, then silu of it times u); u [R, inner] (x W3^T); h
 * prepared; y [R, d]. Prepared rows take floats(rows, k, group) floats (a dot's sizer). */
typedef int64_t (*KhMoeFloats)(int64_t rows, int64_t k, int64_t group);
typedef struct {
    int64_t routes, d, inner, group, segments;
    int64_t *order, *seg_expert, *seg_start;
    float *xs, *h, *u, *hs, *y;
} KhMoeRun;
int64_t kh_moe_work_floats(KhMoeFloats floats, int64_t routes, int64_t d, int64_t inner,
                           int64_t group);
/* Checks the call (KH_EINVAL on a bad bank, pointer, count or expert id), lays out the work
 * and sorts the routes into run. */
int kh_moe_begin(KhMoeRun *run, KhMoeFloats floats, const KhExperts *bank, const float *x,
                 int64_t tokens, int64_t top_k, const int64_t *experts, const float *weights,
                 float *work, float *out, int nthreads);
/* h = silu(h) * u, by route on the pool. */
void kh_moe_silu(const KhMoeRun *run, int nthreads);
/* out[t] = sum over choices c, in order, of weights[t, c] * y[route t * top_k + c]. */
void kh_moe_combine(const KhMoeRun *run, int64_t tokens, int64_t top_k, const float *weights,
                    float *out);
/* 1 when the bank's three stacks are in tiles, 0 when none is, -1 when they mix. */
int kh_moe_tiled(const KhExperts *bank);

#endif
