/* kimi_act.c: the layer call's gated activation, act[i] = silu(g[i]) * u[i] = g[i] / (1 +
 * e^-g[i]) * u[i] (kimi_llama.c), at the level gemv_simd names: AVX-512 16 lanes at a time,
 * AVX2 8 (kh_exp256, about 1 ulp from expf), else expf. Each lane takes the same operations at
 * every width (KH_EXP_FN's one text), and the last n % 8 go through expf at both: AVX-512
 * gives the AVX2 bits (tests/ops/test_llama_layer.py holds the layer to that).
 * Why AVX-512: on the calling thread between two of the pool's jobs, with the helper idle,
 * SmolLM2's 1,536 values a layer and row were ~3% of a verify step of 8 rows (Zen 5). */
#include "kimi_simd.h"

#include <math.h>

static void silu_mul_c(const float *g, const float *u, int64_t n, float *act)
{
    int64_t i;
    for (i = 0; i < n; i++) act[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#if KH_HAVE_X86_SIMD
#define TARGET2 __attribute__((target("avx2,fma,f16c")))
#define TARGET512 __attribute__((target("avx2,fma,f16c,avx512f")))
KH_EXP_FN(exp16, TARGET512, __m512, __m512i, _mm512_, _mm512_roundscale_ps, _mm512_castsi512_ps)

static TARGET2 void silu_mul_avx2(const float *g, const float *u, int64_t n, float *act)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = kh_exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)),
                                                _mm256_loadu_ps(u + i)));
    }
    silu_mul_c(g + i, u + i, n - i, act + i);
}

static TARGET512 void silu_mul_avx512(const float *g, const float *u, int64_t n, float *act)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        _mm512_storeu_ps(act + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)),
                                                _mm512_loadu_ps(u + i)));
    }
    silu_mul_avx2(g + i, u + i, n - i, act + i);
}
#endif

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
