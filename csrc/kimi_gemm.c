/* kimi_gemm.c: the W4A16 GEMM for prefill (see kimi_helper.h, gemm_w4a16).
 *
 * A GEMV pass decodes every weight once per KH_MAX_ROWS rows of x: at 256 rows, 32 decodes
 * of W and 32 trips of W through the caches. Here each thread decodes a tile of KH_GEMM_NB
 * weight rows x KH_GEMM_KC inputs to fp32 on its stack, input-major (16 KiB: L1), once per
 * KH_GEMM_MC rows of x, and runs the classic register block over it: KH_GEMM_MR rows of x x
 * 16 outputs, each step one broadcast of x per row and two 8-lane loads of the tile.
 * Memory traffic: W's codes and scales once per KH_GEMM_MC rows; x [KH_GEMM_MC, KH_GEMM_KC]
 * (256 KiB: L2) once per tile; out once per tile. No [n, k] fp32 copy of W exists.
 *
 * Each output (r, i) is the same sequence of operations whatever rows and nthreads are: a
 * chain of multiply-adds over each block of KH_GEMM_KC inputs in order, added to out block
 * after block. The decoded weight equals the reference's (s*q + m; s*q is exact in fp32), so
 * only the order of the sums differs from it. */
#include "kimi_helper.h"
#include "kimi_gemm.h"

#include <string.h>

typedef struct {
    const float *x;
    const uint8_t *q;
    const uint16_t *s, *m;
    int64_t rows, n, k, group;
    KhGemmDecode decode;
    KhGemmRows run_rows;
    float *out;
} GemmJob;

static void decode_c(const KhRow *w0, int64_t row_bytes, int64_t nb, int64_t k0, int64_t kc,
                     float *tile)
{
    int64_t j, kk, groups = w0->k / w0->group;
    for (j = 0; j < KH_GEMM_NB; j++) {
        const uint8_t *q = w0->q + j * row_bytes;
        KhRow w = {q, w0->scales + j * groups, w0->mins ? w0->mins + j * groups : NULL,
                   w0->k, w0->group};
        if (j >= nb) {
            for (kk = 0; kk < kc; kk++) tile[kk * KH_GEMM_NB + j] = 0.0f;
            continue;
        }
        for (kk = 0; kk < kc;) {
            int64_t g = (k0 + kk) / w.group, end = (g + 1) * w.group - k0;
            float sc = kh_half_to_float(w.scales[g]), mn = kh_row_min(&w, g);
            if (end > kc) end = kc;
            for (; kk < end; kk++) {
                int64_t e = k0 + kk;
                int code = e & 1 ? q[e >> 1] >> 4 : q[e >> 1] & 0x0f;
                tile[kk * KH_GEMM_NB + j] = sc * (float)code + mn;
            }
        }
    }
}

static void rows_c(const float *tile, int64_t kc, const float *x, int64_t x_stride,
                   int64_t rows, float *out, int64_t out_stride, int64_t nb, int first)
{
    float acc[KH_GEMM_MR][KH_GEMM_NB];
    int64_t kk, r, j;
    memset(acc, 0, sizeof acc);
    for (kk = 0; kk < kc; kk++)
        for (r = 0; r < rows; r++) {
            float xv = x[r * x_stride + kk];
            for (j = 0; j < KH_GEMM_NB; j++) acc[r][j] += tile[kk * KH_GEMM_NB + j] * xv;
        }
    for (r = 0; r < rows; r++)
        for (j = 0; j < nb; j++) {
            float *o = out + r * out_stride + j;
            *o = first ? acc[r][j] : *o + acc[r][j];
        }
}

static void gemm_rows(void *ctx, int64_t i0, int64_t end)
{
    const GemmJob *job = ctx;
    float buf[KH_GEMM_NB * KH_GEMM_KC + 16];
    float *tile = (float *)(((uintptr_t)buf + 63) & ~(uintptr_t)63); /* cache-line aligned */
    int64_t m0, k0, i, r;
    for (m0 = 0; m0 < job->rows; m0 += KH_GEMM_MC) {
        int64_t mc = job->rows - m0 < KH_GEMM_MC ? job->rows - m0 : KH_GEMM_MC;
        for (i = i0; i < end; i += KH_GEMM_NB) {
            int64_t nb = end - i < KH_GEMM_NB ? end - i : KH_GEMM_NB;
            KhRow w = kh_row(job->q, job->s, job->m, i, job->k, job->group);
            for (k0 = 0; k0 < job->k; k0 += KH_GEMM_KC) {
                int64_t kc = job->k - k0 < KH_GEMM_KC ? job->k - k0 : KH_GEMM_KC;
                job->decode(&w, job->k / 2, nb, k0, kc, tile);
                for (r = m0; r < m0 + mc; r += KH_GEMM_MR)
                    job->run_rows(tile, kc, job->x + r * job->k + k0, job->k,
                                  m0 + mc - r < KH_GEMM_MR ? m0 + mc - r : KH_GEMM_MR,
                                  job->out + r * job->n + i, job->n, nb, k0 == 0);
            }
        }
    }
}

int gemm_w4a16(const float *x, int64_t rows, const uint8_t *qweight, const uint16_t *scales,
               const uint16_t *mins, int64_t n, int64_t k, int64_t group, float *out,
               int nthreads)
{
    GemmJob job = {.x = x, .q = qweight, .s = scales, .m = mins, .rows = rows, .n = n, .k = k,
                   .group = group, .out = out, .decode = decode_c, .run_rows = rows_c};
    if (!x || !qweight || !scales || !out || rows <= 0 || n <= 0 || k <= 0 || nthreads <= 0
        || group <= 0 || group % 2 || k % group)
        return KH_EINVAL;
#if KH_HAVE_X86_SIMD
    if (gemv_simd(-1) >= 1) { /* AVX-512 machines run the AVX2 kernels too, for now */
        job.decode = group % 8 ? decode_c : kh_gemm_decode_avx2;
        job.run_rows = kh_gemm_rows_avx2;
    }
#endif
    kh_parallel_rows(gemm_rows, &job, n, rows * n * k, nthreads, KH_GEMM_NB);
    return KH_OK;
}
