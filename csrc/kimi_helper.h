/* kimi_helper: the engine's C helper. Plain C99, caller-allocated buffers,
 * int status codes (KH_OK on success). Declares exactly the exported API. */
#ifndef KIMI_HELPER_H
#define KIMI_HELPER_H

#include <stddef.h>
#include <stdint.h>

#define KH_OK 0
#define KH_EINVAL 1      /* bad argument: null pointer, zero or misaligned size */
#define KH_ENOMEM 2      /* a reservation would exceed the memory cap */
#define KH_ESTATE 3      /* release of more than is reserved, or use before init */

/* Packed INT4 -> fp32, w = s*q + m.
 * qweight: [n, k/2] uint8, element 2j in the low nibble, 2j+1 in the high one.
 * scales, mins: [n, k/group] IEEE half bits. out: [n, k] fp32. */
int unpack_int4(const uint8_t *qweight, const uint16_t *scales,
                const uint16_t *mins, int64_t n, int64_t k, int64_t group,
                float *out);

/* Dense W4A16 GEMV: out[r, i] = sum_k x[r, k] * w[i, k] for r < rows (1..8),
 * w = s*q + m as above. x: [rows, k] fp32; out: [rows, n] fp32.
 * work: caller buffer of gemv_w4a16_work_floats(rows, k, group) floats.
 * Each weight byte is read once for all rows; nthreads >= 1 OpenMP threads. */
int64_t gemv_w4a16_work_floats(int64_t rows, int64_t k, int64_t group);
int gemv_w4a16(const float *x, int64_t rows, const uint8_t *qweight,
               const uint16_t *scales, const uint16_t *mins, int64_t n, int64_t k,
               int64_t group, float *work, float *out, int nthreads);

/* Whether the GEMVs use the AVX2 kernels: mode 1 allows them (the default) where the
 * CPU has AVX2+FMA+F16C, 0 forces the portable C, -1 only asks. Returns the state. */
int gemv_simd(int mode);

/* Memory cap: one process-wide budget in bytes (0 = unlimited). */
int memcap_init(uint64_t cap_bytes);
int memcap_reserve(uint64_t nbytes);
int memcap_release(uint64_t nbytes);
uint64_t memcap_reserved(void);
uint64_t memcap_peak(void);
uint64_t memcap_cap(void);

#endif
