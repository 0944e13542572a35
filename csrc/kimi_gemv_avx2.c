/* AVX2 + FMA + F16C block kernel for group % 32 == 0, compiled for those targets
 * by function attribute and chosen at run time, so the default build stays portable.
 * Memory traffic: 16 code bytes + 4 bytes of scale/min per 32 weights, read once
 * for all rows of x; x (de-interleaved) stays in L1/L2. */
#include "kimi_simd.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

#define KH_TARGET __attribute__((target("avx2,fma,f16c")))

int kh_cpu_has_avx2(void)
{
    static int known = -1; /* racing first calls all store the same answer */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                && __builtin_cpu_supports("f16c");
    }
    return known;
}

/* sum_g mins[g] * xsum[g]: the m*sum(x_g) half of the dot product, vectorized (given the
 * scales, -8 times it is a symmetric row's half). The W4A8 kernel shares it. */
KH_TARGET float kh_halves_dot_avx2(const uint16_t *mins, const float *xsum, int64_t groups)
{
    __m256 acc = _mm256_setzero_ps();
    float tail = 0.0f;
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
        __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mins + g)));
        acc = _mm256_fmadd_ps(m, _mm256_loadu_ps(xsum + g), acc);
    }
    for (; g < groups; g++) tail += _cvtsh_ss(mins[g]) * xsum[g];
    return hsum256(acc) + tail;
}

/* 16 code bytes -> four vectors of 8 codes: low nibbles 0-7, 8-15, high 0-7, 8-15. */
#define KH_UNPACK(PTR)                                                              \
    __m128i raw = _mm_loadu_si128((const __m128i *)(PTR));                         \
    __m128i lo = _mm_and_si128(raw, mask);                                         \
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);                      \
    __m256 l0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));                      \
    __m256 l1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));   \
    __m256 h0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));                      \
    __m256 h1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))

/* n fp16 scales -> fp32 (n <= KH_SCALE_CHUNK), 8 at a time. */
static KH_TARGET void halves_to_floats(const uint16_t *h, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) out[i] = _cvtsh_ss(h[i]);
}

/* acc[r] += (sc * codes) . x_r block for every row r: the codes are scaled once, then
 * 4 FMAs per row. One row runs the same operations as many, so a row's result does not
 * depend on the rows batched with it. */
#define KH_BLOCK(ROWS, BLK, SC, ACC)                                               \
    do {                                                                           \
        KH_UNPACK(w->q + (BLK) * 16);                                              \
        l0 = _mm256_mul_ps(l0, SC);                                                \
        l1 = _mm256_mul_ps(l1, SC);                                                \
        h0 = _mm256_mul_ps(h0, SC);                                                \
        h1 = _mm256_mul_ps(h1, SC);                                                \
        for (r = 0; r < ROWS; r++) {                                               \
            const float *xe = xperm + r * w->k + (BLK) * 32;                       \
            ACC[r] = _mm256_fmadd_ps(l0, _mm256_loadu_ps(xe), ACC[r]);             \
            ACC[r] = _mm256_fmadd_ps(l1, _mm256_loadu_ps(xe + 8), ACC[r]);         \
            ACC[r] = _mm256_fmadd_ps(h0, _mm256_loadu_ps(xe + 16), ACC[r]);        \
            ACC[r] = _mm256_fmadd_ps(h1, _mm256_loadu_ps(xe + 24), ACC[r]);        \
        }                                                                          \
    } while (0)

#define KH_SCALE(G) _mm256_set1_ps(_cvtsh_ss(w->scales[G]))

/* ROWS is a constant in each instance, so the row loops unroll and the
 * accumulators live in registers. Two accumulator sets break the FMA chain. */
#define KH_ROW_KERNEL(ROWS)                                                        \
    static KH_TARGET void row_avx2_##ROWS(const KhRow *w, const float *xperm,      \
                                          const float *xsum, float *y,             \
                                          int64_t y_stride)                        \
    {                                                                              \
        const __m128i mask = _mm_set1_epi8(0x0f);                                  \
        int64_t groups = w->k / w->group, blocks = w->group / 32, g, b;            \
        __m256 acc0[ROWS], acc1[ROWS];                                             \
        int r;                                                                     \
        for (r = 0; r < ROWS; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();        \
        if (blocks == 1) {                                                         \
            int64_t g0;                                                            \
            for (g0 = 0; g0 < groups; g0 += KH_SCALE_CHUNK) {                      \
                int64_t gend = g0 + KH_SCALE_CHUNK;                               \
                float scf[KH_SCALE_CHUNK];                                         \
                if (gend > groups) gend = groups;                                  \
                halves_to_floats(w->scales + g0, gend - g0, scf);                  \
                for (g = g0; g + 1 < gend; g += 2) {                               \
                    __m256 sc0 = _mm256_broadcast_ss(scf + g - g0);                \
                    __m256 sc1 = _mm256_broadcast_ss(scf + g + 1 - g0);            \
                    _mm_prefetch((const char *)(w->q + g * 16 + KH_PREFETCH),      \
                                 _MM_HINT_T0);                                     \
                    KH_BLOCK(ROWS, g, sc0, acc0);                                  \
                    KH_BLOCK(ROWS, g + 1, sc1, acc1);                              \
                }                                                                  \
                if (g < gend) {                                                    \
                    __m256 sc0 = _mm256_broadcast_ss(scf + g - g0);                \
                    KH_BLOCK(ROWS, g, sc0, acc0);                                  \
                }                                                                  \
            }                                                                      \
        } else {                                                                   \
            for (g = 0; g < groups; g++) {                                         \
                __m256 sc0 = KH_SCALE(g);                                          \
                for (b = 0; b + 1 < blocks; b += 2) {                              \
                    KH_BLOCK(ROWS, g * blocks + b, sc0, acc0);                     \
                    KH_BLOCK(ROWS, g * blocks + b + 1, sc0, acc1);                 \
                }                                                                  \
                if (b < blocks) KH_BLOCK(ROWS, g * blocks + b, sc0, acc0);         \
            }                                                                      \
        }                                                                          \
        for (r = 0; r < ROWS; r++) {                                                        \
            const float *xs = xsum + r * groups; /* symmetric: min = -8 s */                \
            float mins_term = w->mins ? kh_halves_dot_avx2(w->mins, xs, groups)                       \
                                      : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w->scales, xs, groups));  \
            y[r * y_stride] = hsum256(_mm256_add_ps(acc0[r], acc1[r])) + mins_term;         \
        }                                                                                   \
    }

KH_ROW_KERNEL(1)
KH_ROW_KERNEL(2)
KH_ROW_KERNEL(3)
KH_ROW_KERNEL(4)
KH_ROW_KERNEL(5)
KH_ROW_KERNEL(6)
KH_ROW_KERNEL(7)
KH_ROW_KERNEL(8)

typedef void (*RowAvx2)(const KhRow *, const float *, const float *, float *, int64_t);
static const RowAvx2 by_rows[KH_MAX_ROWS + 1] = {
    0, row_avx2_1, row_avx2_2, row_avx2_3, row_avx2_4,
    row_avx2_5, row_avx2_6, row_avx2_7, row_avx2_8};

void kh_row_blocks_avx2(const KhRow *w, const float *xperm, const float *xsum,
                        int64_t rows, float *y, int64_t y_stride)
{
    by_rows[rows](w, xperm, xsum, y, y_stride);
}

/* 8 halves (fp16: F16C) or 8 bfloat16 (the high half of an fp32: a shift) -> 8 floats. */
#define KH_CVT_F16(P) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P)))
#define KH_CVT_BF16(P) _mm256_castsi256_ps(_mm256_slli_epi32(                               \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(P))), 16))

/* Two fp16 weight rows against every x row, 8 lanes at a time, two FMA chains per weight
 * row (FMA latency); each (row, weight row) pair runs the same operations whatever `rows`
 * is. Memory traffic: 2 bytes per weight, read once per call (the two rows stay in L1 across
 * the x rows). The LM head of an AVX2 machine without AVX-512: F16C converts 8 halves in one
 * instruction where the portable loop converts them one by one. */
#define KH_H16_ROWS(NAME, CVT8, CVT1)                                                      \
    KH_TARGET void NAME(const uint16_t *w0, const uint16_t *w1, int64_t k, const float *x,  \
                        int64_t rows, float *y0, float *y1, int64_t y_stride)               \
    {                                                                                      \
        int64_t r, j, main = k - k % 16;                                                   \
        for (r = 0; r < rows; r++) {                                                       \
            const float *xr = x + r * k;                                                   \
            __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;                    \
            float t0, t1;                                                                  \
            for (j = 0; j < main; j += 16) {                                               \
                __m256 xlo = _mm256_loadu_ps(xr + j), xhi = _mm256_loadu_ps(xr + j + 8);   \
                a0 = _mm256_fmadd_ps(CVT8(w0 + j), xlo, a0);                               \
                b0 = _mm256_fmadd_ps(CVT8(w0 + j + 8), xhi, b0);                           \
                a1 = _mm256_fmadd_ps(CVT8(w1 + j), xlo, a1);                               \
                b1 = _mm256_fmadd_ps(CVT8(w1 + j + 8), xhi, b1);                           \
            }                                                                              \
            t0 = hsum256(_mm256_add_ps(a0, b0));                                           \
            t1 = hsum256(_mm256_add_ps(a1, b1));                                           \
            for (; j < k; j++) {                                                           \
                t0 += CVT1(w0[j]) * xr[j];                                                 \
                t1 += CVT1(w1[j]) * xr[j];                                                 \
            }                                                                              \
            y0[r * y_stride] = t0;                                                         \
            y1[r * y_stride] = t1;                                                         \
        }                                                                                  \
    }

KH_H16_ROWS(kh_f16_rows_avx2, KH_CVT_F16, _cvtsh_ss)
/* bfloat16 weights (Kimi-Linear's kept projections and LM head on the CPU): the same loop. */
KH_H16_ROWS(kh_bf16_rows_avx2, KH_CVT_BF16, kh_bf16_to_float)

#else
typedef int kh_no_x86_simd; /* ISO C forbids an empty translation unit */
#endif
