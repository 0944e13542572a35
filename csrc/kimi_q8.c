/* kimi_q8.c: the Q8_0 GEMV, the tied LM head at the precision the GGUF ships (see
 * kimi_helper.h): int8 weights with an fp16 scale per block of 32, met by x quantized to
 * int8 per block of 32 exactly as gemv_w4a8 quantizes it (kh_quantize_q8, natural order):
 *     y[r, i] = sum_b s[i, b] * d[r, b] * dot(w[i, b], xq[r, b])      (exact int32 dots)
 * Memory traffic: 32 code bytes + 2 scale bytes per 32 weights (GGUF Q8_0), about half of
 * an fp16 head's; x stays in L1. Kernels: those of w4a8_simd's level (kimi_int8_body.h: the
 * same bits from AVX2, AVX-VNNI and AVX-512 VNNI) or portable C; q8_simd() says which. */
#include "kimi_helper.h"
#include "kimi_simd.h"

/* Portable kernel: one weight row against `rows` quantized rows of x. */
static void q8_row_c(const int8_t *w, const uint16_t *s, int64_t k, const KhQ8 *x,
                     int64_t rows, float *y, int64_t y_stride)
{
    int64_t nb = k / KH_Q8_BLOCK, b, r;
    float acc[KH_MAX_ROWS] = {0};
    for (b = 0; b < nb; b++) {
        const int8_t *wb = w + b * KH_Q8_BLOCK;
        float sw = kh_half_to_float(s[b]);
        for (r = 0; r < rows; r++) {
            const int8_t *xb = x->q + r * k + b * KH_Q8_BLOCK;
            int32_t dot = 0;
            int j;
            for (j = 0; j < KH_Q8_BLOCK; j++) dot += (int32_t)wb[j] * xb[j];
            acc[r] += sw * x->d[r * nb + b] * (float)dot;
        }
    }
    for (r = 0; r < rows; r++) y[r * y_stride] = acc[r];
}

int q8_simd(void)
{
    return w4a8_simd(-1);
}

int64_t gemv_q8_work_floats(int64_t rows, int64_t k)
{
    if (rows <= 0 || k <= 0 || k % KH_Q8_BLOCK) return -1;
    return kh_q8_floats(rows, k, k); /* one gsum per row, unused: no min term */
}

typedef struct {
    const int8_t *q;
    const uint16_t *s;
    KhQ8 x;
    int64_t rows, n, k;
    const KhInt8Kernels *kernels; /* NULL: portable C */
    float *out;
} Q8Job;

static void q8_rows(void *ctx, int64_t i, int64_t end)
{
    const Q8Job *job = ctx;
    int64_t k = job->k;
    for (; i < end; i++) {
        const int8_t *w = job->q + i * k;
        const uint16_t *s = job->s + i * (k / KH_Q8_BLOCK);
        if (job->kernels) {
            job->kernels->q8q8(w, s, k, &job->x, job->rows, job->out + i, job->n);
            continue;
        }
        q8_row_c(w, s, k, &job->x, job->rows, job->out + i, job->n);
    }
}

int gemv_q8(const float *x, int64_t rows, const int8_t *qweight, const uint16_t *scales,
            int64_t n, int64_t k, float *work, float *out, int nthreads)
{
    Q8Job job = {.q = qweight, .s = scales, .rows = rows, .n = n, .k = k, .out = out};
    if (rows <= 0 || rows > KH_MAX_ROWS || n <= 0 || nthreads <= 0) return KH_EINVAL;
    if (gemv_q8_work_floats(rows, k) < 0) return KH_EINVAL;
    if (!x || !qweight || !scales || !work || !out) return KH_EINVAL;
    job.x = kh_q8_at(work, rows, k, k);
    kh_quantize_q8(x, rows, k, k, 0, &job.x);
    job.kernels = kh_int8_kernels();
    kh_parallel_rows(q8_rows, &job, n, n * k, nthreads, 1);
    return KH_OK;
}

int q8_embed(const int8_t *q, const uint16_t *s, int tiles, int64_t n, int64_t k,
             const int64_t *ids, int64_t rows, float *out)
{
    int64_t r, b, c, nb = k / KH_Q8_BLOCK;
    if (!q || !s || !ids || !out || rows < 0 || n <= 0 || k <= 0 || k % KH_Q8_BLOCK
        || (tiles && n % KH_TILE))
        return KH_EINVAL;
    for (r = 0; r < rows; r++)
        if (ids[r] < 0 || ids[r] >= n) return KH_EINVAL;
    for (r = 0; r < rows; r++) { /* per block: its scale once, then its 32 codes */
        int64_t id = ids[r], tile = id / KH_TILE, lane = id % KH_TILE;
        float *y = out + r * k;
        for (b = 0; b < nb; b++) {
            float scale = kh_half_to_float(tiles ? s[(tile * nb + b) * KH_TILE + lane] : s[id * nb + b]);
            for (c = b * KH_Q8_BLOCK; c < (b + 1) * KH_Q8_BLOCK; c += 4) {
                /* tiles: inputs c..c+3 of row id are 4 bytes at chunk c/4, lane `lane` */
                const int8_t *codes = tiles ? q + ((tile * (k / 4) + c / 4) * KH_TILE + lane) * 4
                                            : q + id * k + c;
                y[c] = (float)codes[0] * scale;
                y[c + 1] = (float)codes[1] * scale;
                y[c + 2] = (float)codes[2] * scale;
                y[c + 3] = (float)codes[3] * scale;
            }
        }
    }
    return KH_OK;
}
