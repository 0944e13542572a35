/* AVX-512F block kernel for group % 32 == 0: one 16-byte block of codes becomes two
 * 16-lane vectors (even and odd elements), half the instructions of the AVX2 kernel.
 * Compiled for these targets by function attribute and chosen at run time. */
#include "kimi_simd.h"

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

#define KH_TARGET512 __attribute__((target("avx512f,avx2,fma,f16c")))

int kh_cpu_has_avx512(void)
{
    static int known = -1; /* racing first calls all store the same answer */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && kh_cpu_has_avx2();
    }
    return known;
}

static KH_TARGET512 float mins_dot512(const uint16_t *mins, const float *xsum, int64_t groups)
{
    __m512 acc = _mm512_setzero_ps();
    float tail = 0.0f;
    int64_t g = 0;
    for (; g + 16 <= groups; g += 16) {
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mins + g)));
        acc = _mm512_fmadd_ps(m, _mm512_loadu_ps(xsum + g), acc);
    }
    for (; g < groups; g++) tail += _cvtsh_ss(mins[g]) * xsum[g];
    return _mm512_reduce_add_ps(acc) + tail;
}

/* n fp16 scales -> fp32 (n <= KH_SCALE_CHUNK), 16 at a time. */
static KH_TARGET512 void halves_to_floats(const uint16_t *h, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i,
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    for (; i < n; i++) out[i] = _cvtsh_ss(h[i]);
}

/* acc[r] += (sc * codes) . x_r block for every row r: the codes are scaled once, then
 * 2 FMAs per row. One row runs the same operations as many (no dot-then-scale shortcut),
 * so a row's result does not depend on the rows batched with it. */
#define KH_BLOCK512(ROWS, BLK, SC, ACC)                                            \
    do {                                                                             \
        __m128i raw = _mm_loadu_si128((const __m128i *)(w->q + (BLK) * 16));         \
        __m512 ev = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, mask))); \
        __m512 od = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(                         \
            _mm_and_si128(_mm_srli_epi16(raw, 4), mask)));                           \
        ev = _mm512_mul_ps(ev, SC);                                                  \
        od = _mm512_mul_ps(od, SC);                                                  \
        for (r = 0; r < ROWS; r++) {                                                 \
            const float *xe = xperm + r * w->k + (BLK) * 32;                         \
            ACC[r] = _mm512_fmadd_ps(ev, _mm512_loadu_ps(xe), ACC[r]);               \
            ACC[r] = _mm512_fmadd_ps(od, _mm512_loadu_ps(xe + 16), ACC[r]);          \
        }                                                                            \
    } while (0)

#define KH_SCALE512(G) _mm512_set1_ps(_cvtsh_ss(w->scales[G]))

#define KH_ROW_KERNEL512(ROWS)                                                       \
    static KH_TARGET512 void row_avx512_##ROWS(const KhRow *w, const float *xperm,   \
                                               const float *xsum, float *y,          \
                                               int64_t y_stride)                     \
    {                                                                                \
        const __m128i mask = _mm_set1_epi8(0x0f);                                    \
        int64_t groups = w->k / w->group, blocks = w->group / 32, g, b;              \
        __m512 acc0[ROWS], acc1[ROWS];                                               \
        int r;                                                                       \
        for (r = 0; r < ROWS; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();          \
        if (blocks == 1) {                                                         \
            int64_t g0;                                                            \
            for (g0 = 0; g0 < groups; g0 += KH_SCALE_CHUNK) {                      \
                int64_t gend = g0 + KH_SCALE_CHUNK;                               \
                float scf[KH_SCALE_CHUNK];                                         \
                if (gend > groups) gend = groups;                                  \
                halves_to_floats(w->scales + g0, gend - g0, scf);                  \
                for (g = g0; g + 1 < gend; g += 2) {                               \
                    __m512 sc0 = _mm512_set1_ps(scf[g - g0]);                      \
                    __m512 sc1 = _mm512_set1_ps(scf[g + 1 - g0]);                  \
                    _mm_prefetch((const char *)(w->q + g * 16 + KH_PREFETCH),      \
                                 _MM_HINT_T0);                                     \
                    KH_BLOCK512(ROWS, g, sc0, acc0);                               \
                    KH_BLOCK512(ROWS, g + 1, sc1, acc1);                           \
                }                                                                  \
                if (g < gend) {                                                    \
                    __m512 sc0 = _mm512_set1_ps(scf[g - g0]);                      \
                    KH_BLOCK512(ROWS, g, sc0, acc0);                               \
                }                                                                  \
            }                                                                      \
        } else {                                                                     \
            for (g = 0; g < groups; g++) {                                           \
                __m512 sc0 = KH_SCALE512(g);                                         \
                for (b = 0; b + 1 < blocks; b += 2) {                                \
                    KH_BLOCK512(ROWS, g * blocks + b, sc0, acc0);                  \
                    KH_BLOCK512(ROWS, g * blocks + b + 1, sc0, acc1);              \
                }                                                                    \
                if (b < blocks) KH_BLOCK512(ROWS, g * blocks + b, sc0, acc0);      \
            }                                                                        \
        }                                                                            \
        for (r = 0; r < ROWS; r++) {                                                              \
            const float *xs = xsum + r * groups; /* symmetric: min = -8 s */                      \
            float mins_term = w->mins ? mins_dot512(w->mins, xs, groups)                          \
                                      : KH_SYMMETRIC_MIN(mins_dot512(w->scales, xs, groups));     \
            y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) + mins_term;  \
        }                                                                                         \
    }

KH_ROW_KERNEL512(1)
KH_ROW_KERNEL512(2)
KH_ROW_KERNEL512(3)
KH_ROW_KERNEL512(4)
KH_ROW_KERNEL512(5)
KH_ROW_KERNEL512(6)
KH_ROW_KERNEL512(7)
KH_ROW_KERNEL512(8)

typedef void (*RowAvx512)(const KhRow *, const float *, const float *, float *, int64_t);
static const RowAvx512 by_rows[KH_MAX_ROWS + 1] = {
    0, row_avx512_1, row_avx512_2, row_avx512_3, row_avx512_4,
    row_avx512_5, row_avx512_6, row_avx512_7, row_avx512_8};

void kh_row_blocks_avx512(const KhRow *w, const float *xperm, const float *xsum,
                          int64_t rows, float *y, int64_t y_stride)
{
    by_rows[rows](w, xperm, xsum, y, y_stride);
}

/* Two fp16 weight rows against every x row, 16 lanes at a time; each (row, weight row)
 * pair is one FMA chain in a fixed order whatever `rows` is. Memory traffic: 2 bytes
 * per weight, read once per call (the two rows stay in L1 across the x rows). */
KH_TARGET512 void kh_f16_rows_avx512(const uint16_t *w0, const uint16_t *w1, int64_t k,
                                     const float *x, int64_t rows, float *y0, float *y1,
                                     int64_t y_stride)
{
    int64_t r, j, main = k - k % 16;
    for (r = 0; r < rows; r++) {
        const float *xr = x + r * k;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        float t0, t1;
        for (j = 0; j < main; j += 16) {
            __m512 xv = _mm512_loadu_ps(xr + j);
            a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + j))),
                                 xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w1 + j))),
                                 xv, a1);
        }
        t0 = _mm512_reduce_add_ps(a0);
        t1 = _mm512_reduce_add_ps(a1);
        for (; j < k; j++) {
            t0 += _cvtsh_ss(w0[j]) * xr[j];
            t1 += _cvtsh_ss(w1[j]) * xr[j];
        }
        y0[r * y_stride] = t0;
        y1[r * y_stride] = t1;
    }
}

#else
typedef int kh_no_x86_simd512; /* ISO C forbids an empty translation unit */
#endif
