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
