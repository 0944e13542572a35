/* kimi_moe_w4a8.c: the grouped MoE's W4A8 dot (kh_moe_w4a8, for moe_grouped_w4a8). The
 * routes, segments and choice-order sums are kimi_moe.c's loop; each route's x row, and each
 * row of h, is quantized to int8 per block of 32 exactly as gemv_w4a8 quantizes
 * (kh_q8_prepare), and the chosen experts' rows meet them through gemv_w4a8's kernels
 * (kh_q8_dots): a segment of one row (a decode token) takes 4 weight rows per x load, a
 * longer one its rows 8 at a time. A job item is (segment, matrix, 4 output rows). The kernels
 * and the quantization work per row, so a token's result is the same bits whatever tokens
 * share the call. */
#include "kimi_moe.h"

static int64_t w4a8_floats(int64_t rows, int64_t k, int64_t group)
{
    return group % KH_Q8_BLOCK ? -1 : kh_q8_floats(rows, k, group);
}

static KhMoeRows w4a8_at(float *base, int64_t rows, int64_t k, int64_t group)
{
    KhMoeRows op = {.k = k, .group = group, .plan = kh_q8_plan(k),
                    .q8 = kh_q8_at(base, rows, k, group)};
    return op;
}

/* Rows row.. of the quantized set. */
static KhQ8 q8_from(const KhMoeRows *op, int64_t row)
{
    KhQ8 q8 = {op->q8.q + row * op->k, op->q8.d + row * (op->k / KH_Q8_BLOCK),
               op->q8.gsum + row * (op->k / op->group)};
    return q8;
}

static void w4a8_prepare(const KhMoeRows *op, const float *src, int64_t row, int64_t count)
{
    KhQ8 q8 = q8_from(op, row);
    kh_q8_prepare(&op->plan, src, count, op->k, op->group, &q8);
}

static void w4a8_dots(const KhMoeRows *op, const KhRow *w, int count, int64_t r0, int64_t rows,
                      float *y, int64_t y_stride)
{
    KhQ8 q8 = q8_from(op, r0);
    kh_q8_dots(&op->plan, w, count, &q8, rows, y, y_stride);
}

const KhMoeDot kh_moe_w4a8 = {4, w4a8_floats, w4a8_at, w4a8_prepare, w4a8_dots};
