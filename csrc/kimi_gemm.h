/* Internal to the C helper (not exported): the W4A16 GEMM's blocking and the tile kernels
 * that kimi_gemm.c drives (kimi_gemm_avx2.c has the AVX2 ones). Not part of the cffi API. */
#ifndef KIMI_GEMM_H
#define KIMI_GEMM_H

#include <stdint.h>

#include "kimi_simd.h"           /* KhRow, KH_HAVE_X86_SIMD */

/* Tiles of KH_GEMM_NB weight rows x KH_GEMM_KC inputs decoded to fp32 and stored input-major
 * (tile[kk][j], 16 KiB), met by KH_GEMM_MC rows of x at a time, KH_GEMM_MR rows per register
 * block of KH_GEMM_MR x 16 outputs. */
#define KH_GEMM_NB 16
#define KH_GEMM_KC 256
#define KH_GEMM_MC 256
#define KH_GEMM_MR 6

/* tile[kk * KH_GEMM_NB + j] = weight (row j of w0 onwards, row stride row_bytes of codes) at
 * input k0 + kk, for kk < kc; columns j >= nb are zero. */
typedef void (*KhGemmDecode)(const KhRow *w0, int64_t row_bytes, int64_t nb, int64_t k0,
                             int64_t kc, float *tile);
/* out[r][j] (= when first, else +=) dot(x row r, tile column j) over kc inputs, for r < rows
 * (1..KH_GEMM_MR) and j < nb; x and out rows at x_stride and out_stride. */
typedef void (*KhGemmRows)(const float *tile, int64_t kc, const float *x, int64_t x_stride,
                           int64_t rows, float *out, int64_t out_stride, int64_t nb, int first);

#if KH_HAVE_X86_SIMD
/* AVX2 + FMA + F16C; decode needs group % 8 == 0. */
void kh_gemm_decode_avx2(const KhRow *w0, int64_t row_bytes, int64_t nb, int64_t k0,
                         int64_t kc, float *tile);
void kh_gemm_rows_avx2(const float *tile, int64_t kc, const float *x, int64_t x_stride,
                       int64_t rows, float *out, int64_t out_stride, int64_t nb, int first);
#endif

#endif
