/* kimi_act.c: the Llama layer call's row-wise work between its GEMVs (kimi_llama.c), on the
 * calling thread while the pool's helper waits, at the level gemv_simd names.
 *
 * The gated activation, act[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i]: AVX-512 16
 * lanes at a time, AVX2 8 (kh_exp256, about 1 ulp from expf), else expf. Each lane takes the
 * same operations at every width (KH_EXP_FN's one text), and the last n % 8 go through expf at
 * both: AVX-512 gives the AVX2 bits (tests/ops/test_llama_layer.py holds the layer to that).
 * Why AVX-512: on the calling thread between two of the pool's jobs, with the helper idle,
 * SmolLM2's 1,536 values a layer and row were ~3% of a verify step of 8 rows (Zen 5).
 *
 * The RMS norm, RoPE and the residual adds: AVX-512 where gemv_simd allows it, each element
 * taking the portable loop's operations in its order (no FMA: the build contracts none), so
 * every level gives the same bits. Why: that work is a row's, not a step's, and the helper
 * idles through it; with the merge of attention's ranges (kimi_attn_avx512.c) it was half of
 * what each further row of a verify step cost (~100 of ~200 us, SmolLM2, Zen 5, 2026-12-08). */
#include "kimi_simd.h"

#include <math.h>

/* y = x / sqrt(mean(x^2) + eps) * w, the sum of squares in double, in 8 independent partial
 * sums (lane l takes i = l mod 8), added as a tree: the one chain, each add waiting on the
 * last, was ~2,300 cycles a norm of SmolLM2's 576, two a layer and row (~12% of what a verify
 * step's row adds). (x * inv) * w from the sum: the wide kernel's operations too. */
static float rms_inverse(const double part[8], int64_t d, float eps)
{
    return 1.0f / sqrtf((float)((((part[0] + part[4]) + (part[1] + part[5]))
                                 + ((part[2] + part[6]) + (part[3] + part[7]))) / (double)d) + eps);
}

static void rms_norm_c(const float *x, const float *w, int64_t d, float eps, float *y)
{
    double part[8] = {0};
    int64_t i;
    int l;
    float inv;
    for (i = 0; i + 8 <= d; i += 8)
        for (l = 0; l < 8; l++) part[l] += (double)x[i + l] * x[i + l];
    for (; i < d; i++) part[0] += (double)x[i] * x[i];
    inv = rms_inverse(part, d, eps);
    for (i = 0; i < d; i++) y[i] = x[i] * inv * w[i];
}

/* Rotate-half RoPE on `heads` heads of x in place; sin's first half is already negated
 * (engined/layers/rope.py): out[i] = x[i +- hd/2] * sin[i] + x[i] * cos[i], from `from` on. */
static void rope_c(float *x, int64_t heads, int64_t hd, const float *cos, const float *sin,
                   int64_t from)
{
    int64_t h, i, half = hd / 2;
    for (h = 0; h < heads; h++) {
        float *v = x + h * hd;
        for (i = from; i < half; i++) {
            float lo = v[i], hi = v[i + half];
            v[i] = hi * sin[i] + lo * cos[i];
            v[i + half] = lo * sin[i + half] + hi * cos[i + half];
        }
    }
}

static void silu_mul_c(const float *g, const float *u, int64_t n, float *act)
{
    int64_t i;
    for (i = 0; i < n; i++) act[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#if KH_HAVE_X86_SIMD
#define TARGET2 __attribute__((target("avx2,fma,f16c")))
#define TARGET512 __attribute__((target("avx2,fma,f16c,avx512f")))
KH_EXP_FN(exp16, TARGET512, __m512, __m512i, _mm512_, _mm512_roundscale_ps, _mm512_castsi512_ps)

/* NAME: act[i] for i < n, the LANES lanes of VF at a time through EXP, the rest by REST. One
 * text for both widths (P: the intrinsics' prefix), so that each lane's operations are the same. */
#define KH_SILU_FN(NAME, TARGET, VF, P, LANES, EXP, REST)                                      \
    static TARGET void NAME(const float *g, const float *u, int64_t n, float *act)             \
    {                                                                                          \
        const VF one = P##set1_ps(1.0f);                                                       \
        int64_t i = 0;                                                                         \
        for (; i + (LANES) <= n; i += (LANES)) {                                               \
            VF gv = P##loadu_ps(g + i);                                                        \
            VF e = EXP(P##sub_ps(P##setzero_ps(), gv));                                        \
            VF s = P##div_ps(gv, P##add_ps(one, e));                                           \
            P##storeu_ps(act + i, P##mul_ps(s, P##loadu_ps(u + i)));                           \
        }                                                                                      \
        REST(g + i, u + i, n - i, act + i);                                                    \
    }
KH_SILU_FN(silu_mul_avx2, TARGET2, __m256, _mm256_, 8, kh_exp256, silu_mul_c)
KH_SILU_FN(silu_mul_avx512, TARGET512, __m512, _mm512_, 16, exp16, silu_mul_avx2)

/* rms_norm_c's operations: the 8 partial sums are one register's 8 double lanes. */
static TARGET512 void rms_norm_avx512(const float *x, const float *w, int64_t d, float eps,
                                      float *y)
{
    __m512d sum = _mm512_setzero_pd();
    __m512 inv_v;
    double part[8];
    int64_t i;
    float inv;
    for (i = 0; i + 8 <= d; i += 8) {
        __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        sum = _mm512_add_pd(sum, _mm512_mul_pd(v, v));
    }
    _mm512_storeu_pd(part, sum);
    for (; i < d; i++) part[0] += (double)x[i] * x[i];
    inv = rms_inverse(part, d, eps);
    inv_v = _mm512_set1_ps(inv);
    for (i = 0; i + 16 <= d; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv_v),
                                              _mm512_loadu_ps(w + i)));
    for (; i < d; i++) y[i] = x[i] * inv * w[i];
}

/* rope_c's operations on 16 pairs a register, the rest of each head's by rope_c. */
static TARGET512 void rope_avx512(float *x, int64_t heads, int64_t hd, const float *cos,
                                  const float *sin)
{
    int64_t h, i, half = hd / 2, wide = half / 16 * 16;
    for (h = 0; h < heads; h++) {
        float *v = x + h * hd;
        for (i = 0; i < wide; i += 16) {
            __m512 lo = _mm512_loadu_ps(v + i), hi = _mm512_loadu_ps(v + i + half);
            _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_mul_ps(hi, _mm512_loadu_ps(sin + i)),
                                                  _mm512_mul_ps(lo, _mm512_loadu_ps(cos + i))));
            _mm512_storeu_ps(v + i + half,
                             _mm512_add_ps(_mm512_mul_ps(lo, _mm512_loadu_ps(sin + i + half)),
                                           _mm512_mul_ps(hi, _mm512_loadu_ps(cos + i + half))));
        }
    }
    if (wide < half) rope_c(x, heads, hd, cos, sin, wide);
}

static TARGET512 void add_avx512(float *x, const float *y, int64_t n)
{
    int64_t i;
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) x[i] += y[i];
}
#endif

/* Whether this call's row-wise work runs in 512 bits (gemv_simd's level 2 and above). */
static int is_wide(void)
{
#if KH_HAVE_X86_SIMD
    return gemv_simd(-1) >= 2;
#else
    return 0;
#endif
}

void kh_rms_norm(const float *x, const float *w, int64_t d, float eps, float *y)
{
#if KH_HAVE_X86_SIMD
    if (is_wide()) {
        rms_norm_avx512(x, w, d, eps, y);
        return;
    }
#endif
    rms_norm_c(x, w, d, eps, y);
}

void kh_rope(float *x, int64_t heads, int64_t hd, const float *cos, const float *sin)
{
#if KH_HAVE_X86_SIMD
    if (is_wide()) {
        rope_avx512(x, heads, hd, cos, sin);
        return;
    }
#endif
    rope_c(x, heads, hd, cos, sin, 0);
}

void kh_add(float *x, const float *y, int64_t n)
{
    int64_t i;
#if KH_HAVE_X86_SIMD
    if (is_wide()) {
        add_avx512(x, y, n);
        return;
    }
#endif
    for (i = 0; i < n; i++) x[i] += y[i];
}

void kh_silu_mul(const float *g, const float *u, int64_t n, float *act)
{
#if KH_HAVE_X86_SIMD
    int level = gemv_simd(-1);
    if (level >= 2) {
        silu_mul_avx512(g, u, n, act);
        return;
    }
    if (level >= 1) {
        silu_mul_avx2(g, u, n, act);
        return;
    }
#endif
    silu_mul_c(g, u, n, act);
}
