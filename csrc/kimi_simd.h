/* Internal to the C helper (not exported): one weight row and the row kernels
 * that the GEMVs share. Not part of the cffi API. */
#ifndef KIMI_SIMD_H
#define KIMI_SIMD_H

#include <stdint.h>

#define KH_MAX_ROWS 8            /* rows of x handled in one pass over the weights */
#define KH_SERIAL_BELOW 16384    /* n*k below this runs on one thread: fork/join costs more */

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define KH_HAVE_X86_SIMD 1
#else
#define KH_HAVE_X86_SIMD 0
#endif

/* One packed weight row: q [k/2] codes, scales and mins [k/group] half bits. */
typedef struct {
    const uint8_t *q;
    const uint16_t *scales;
    const uint16_t *mins;
    int64_t k;
    int64_t group;
} KhRow;

/* y[r * y_stride] = dot(w, x_r) for r < rows; xperm/xsum as prepared by the GEMV. */
typedef void (*KhRowFn)(const KhRow *w, const float *xperm, const float *xsum,
                        int64_t rows, float *y, int64_t y_stride);

KhRowFn kh_pick_row_fn(int64_t group);
float kh_half_to_float(uint16_t h); /* exact IEEE binary16 -> float */

#if KH_HAVE_X86_SIMD
int kh_cpu_has_avx2(void);
void kh_row_blocks_avx2(const KhRow *w, const float *xperm, const float *xsum,
                        int64_t rows, float *y, int64_t y_stride);
#endif

#endif
