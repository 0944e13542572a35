/* Internal: what the tile kernel sets share (kimi_tiles_simd.c W4A8, kimi_tiles_i16_simd.c
 * W4A16, kimi_q8_tiles_simd.c Q8_0): the two targets, x's 4 bytes to broadcast, and AVX2's
 * scales and mins of one group of a tile as two halves of 8. Included once per such file,
 * after kimi_tiles.h, where KH_HAVE_X86_SIMD holds.
 * -DKH_VNNI_EMULATE (tests/vnni_emulated.sh): SIMDe stands in for AVX-512 (kimi_w4a8_vnni.c). */
#ifndef KIMI_TILES_SIMD_H
#define KIMI_TILES_SIMD_H

#include <immintrin.h>
#include <string.h>

#ifdef KH_VNNI_EMULATE
#include "simde_vnni.h"
#define TARGET512 __attribute__((target("avx2,fma,f16c")))
#else
#define TARGET512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif
#define TARGET2 __attribute__((target("avx2,fma,f16c")))

static inline int32_t load4(const int8_t *p) /* 4 bytes of x, to broadcast */
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Group g of tile t: s[h] and m[h] for lanes 8h..8h+7 (symmetric: m = -8 s). */
static TARGET2 inline void tile_scales2(const KhTiles *w, int64_t t, int64_t g, __m256 s[2],
                                        __m256 m[2])
{
    int64_t groups = w->k / w->group;
    int h;
    for (h = 0; h < 2; h++) {
        int64_t at = (t * groups + g) * KH_TILE + 8 * h;
        s[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->s + at)));
        m[h] = w->m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->m + at)))
                    : _mm256_mul_ps(s[h], _mm256_set1_ps(-8.0f));
    }
}

#endif
