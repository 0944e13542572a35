/* AVX2 + FMA + F16C kernels of the W4A16 GEMM (kimi_gemm.c), compiled for those targets by
 * function attribute and chosen at run time.
 * Memory traffic per step of the register block: 64 bytes of the decoded tile (L1) and one
 * float of x per row (L1 after the first tile column block), for 2 * KH_GEMM_MR FMAs; the 12
 * accumulators (6 rows x 16 outputs) stay in registers for the whole block of inputs. */
#include "kimi_gemm.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

#define KH_TARGET __attribute__((target("avx2,fma,f16c")))

/* r[t] (8 values of row t) -> r[c] (value c of rows 0..7): the 8x8 transpose. */
static KH_TARGET inline void transpose8(__m256 *r)
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* 8 codes of a row (4 bytes at q) -> 8 fp32 weights s*q + m (the fused product is exact, so
 * this is the reference's value). */
static KH_TARGET inline __m256 decode8(const uint8_t *q, __m256 sc, __m256 mn)
{
    const __m128i mask = _mm_set1_epi8(0x0f);
    int32_t bytes;
    __m128i raw, codes;
    memcpy(&bytes, q, sizeof bytes);
    raw = _mm_cvtsi32_si128(bytes);
    codes = _mm_unpacklo_epi8(_mm_and_si128(raw, mask),
                              _mm_and_si128(_mm_srli_epi16(raw, 4), mask));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), sc, mn);
}

/* group % 8 == 0 (and k0 % 8 == 0), so 8 inputs never straddle two groups: each row's 8
 * inputs decode at once, then 8 rows are transposed into 8 input-major lines of the tile. */
KH_TARGET void kh_gemm_decode_avx2(const KhRow *w0, int64_t row_bytes, int64_t nb, int64_t k0,
                                   int64_t kc, float *tile)
{
    float sc[KH_GEMM_NB], mn[KH_GEMM_NB];
    int64_t kk, j, group = w0->group, groups = w0->k / group, g_now = -1;
    for (kk = 0; kk < kc; kk += 8) {
        int64_t g = (k0 + kk) / group, half;
        if (g != g_now) {
            for (j = 0; j < nb; j++) {
                KhRow w = {NULL, w0->scales + j * groups, w0->mins ? w0->mins + j * groups : NULL,
                           w0->k, group};
                sc[j] = _cvtsh_ss(w.scales[g]);
                mn[j] = kh_row_min(&w, g);
            }
            g_now = g;
        }
        for (half = 0; half < KH_GEMM_NB; half += 8) {
            __m256 r[8];
            int t;
            for (t = 0; t < 8; t++) {
                j = half + t;
                r[t] = j < nb ? decode8(w0->q + j * row_bytes + (k0 + kk) / 2,
                                        _mm256_set1_ps(sc[j]), _mm256_set1_ps(mn[j]))
                              : _mm256_setzero_ps();
            }
            transpose8(r);
            for (t = 0; t < 8; t++) _mm256_store_ps(tile + (kk + t) * KH_GEMM_NB + half, r[t]);
        }
    }
}

/* out[0..nb) = (first ? 0 : out) + [lo | hi]. */
static KH_TARGET inline void store16(float *out, __m256 lo, __m256 hi, int64_t nb, int first)
{
    float v[KH_GEMM_NB];
    int64_t j;
    if (nb == KH_GEMM_NB) {
        if (!first) {
            lo = _mm256_add_ps(_mm256_loadu_ps(out), lo);
            hi = _mm256_add_ps(_mm256_loadu_ps(out + 8), hi);
        }
        _mm256_storeu_ps(out, lo);
        _mm256_storeu_ps(out + 8, hi);
        return;
    }
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + 8, hi);
    for (j = 0; j < nb; j++) out[j] = first ? v[j] : out[j] + v[j];
}

/* ROWS rows of x against the 16 tile columns: lo_r/hi_r hold outputs 0-7 and 8-15 of row r
 * (named registers, not an array: GCC spilled an array of accumulators every step). Every
 * ROWS runs the same chain of FMAs per output. */
#define KH_GEMM_STEP(ROWS, R)                                                              \
    if (ROWS > R) {                                                                        \
        __m256 xv = _mm256_broadcast_ss(x + R * x_stride + kk);                            \
        lo##R = _mm256_fmadd_ps(w0, xv, lo##R);                                            \
        hi##R = _mm256_fmadd_ps(w1, xv, hi##R);                                            \
    }
#define KH_GEMM_STORE(ROWS, R)                                                             \
    if (ROWS > R) store16(out + R * out_stride, lo##R, hi##R, nb, first);
#define KH_GEMM_ROWS(ROWS)                                                                 \
    static KH_TARGET void rows_##ROWS(const float *tile, int64_t kc, const float *x,       \
                                      int64_t x_stride, float *out, int64_t out_stride,    \
                                      int64_t nb, int first)                               \
    {                                                                                      \
        __m256 lo0 = _mm256_setzero_ps(), lo1 = lo0, lo2 = lo0, lo3 = lo0, lo4 = lo0;      \
        __m256 lo5 = lo0, hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0, hi4 = lo0, hi5 = lo0; \
        int64_t kk;                                                                        \
        for (kk = 0; kk < kc; kk++) {                                                      \
            __m256 w0 = _mm256_load_ps(tile + kk * KH_GEMM_NB);                            \
            __m256 w1 = _mm256_load_ps(tile + kk * KH_GEMM_NB + 8);                        \
            KH_GEMM_STEP(ROWS, 0) KH_GEMM_STEP(ROWS, 1) KH_GEMM_STEP(ROWS, 2)              \
            KH_GEMM_STEP(ROWS, 3) KH_GEMM_STEP(ROWS, 4) KH_GEMM_STEP(ROWS, 5)              \
        }                                                                                  \
        KH_GEMM_STORE(ROWS, 0) KH_GEMM_STORE(ROWS, 1) KH_GEMM_STORE(ROWS, 2)               \
        KH_GEMM_STORE(ROWS, 3) KH_GEMM_STORE(ROWS, 4) KH_GEMM_STORE(ROWS, 5)               \
    }

KH_GEMM_ROWS(1)
KH_GEMM_ROWS(2)
KH_GEMM_ROWS(3)
KH_GEMM_ROWS(4)
KH_GEMM_ROWS(5)
KH_GEMM_ROWS(6)

typedef void (*RowsAvx2)(const float *, int64_t, const float *, int64_t, float *, int64_t,
                         int64_t, int);
static const RowsAvx2 by_rows[KH_GEMM_MR + 1] = {0, rows_1, rows_2, rows_3, rows_4, rows_5,
                                                 rows_6};

void kh_gemm_rows_avx2(const float *tile, int64_t kc, const float *x, int64_t x_stride,
                       int64_t rows, float *out, int64_t out_stride, int64_t nb, int first)
{
    by_rows[rows](tile, kc, x, x_stride, out, out_stride, nb, first);
}

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
