/* Internal to the C helper (not exported): the W4A8 tile kernels that kimi_tiles.c drives
 * (kimi_tiles_simd.c has the AVX2 and AVX-512 VNNI ones). Not part of the cffi API.
 *
 * A linear in tiles (see kimi_helper.h, tiles_w4a8): KH_TILE output rows per tile; per tile
 * t and chunk c of 8 inputs, 64 bytes, 4 per row j of the tile, byte i holding the codes of
 * inputs 8c + i (low nibble) and 8c + 4 + i (high nibble); scales and mins [n/16, k/group, 16].
 * So one 64-byte load and two masks give, for 16 rows at once, the 4 codes that one broadcast
 * int32 of x meets in vpdpbusd: no shuffles and no horizontal sums.
 *
 * Every kernel computes each output (r, row) by the same operations (tiles_c's text):
 *     acc = 0; per group g: per block b of g: acc = fma((float) dot_b, s_g * d_b, acc);
 *     then acc = fma(m_g, gsum_g, acc)     (dot_b the exact int32 dot of block b)
 * so every instruction set, every blocking and every batch gives the same bits. */
#ifndef KIMI_TILES_H
#define KIMI_TILES_H

#include <stdint.h>

#include "kimi_simd.h" /* KhQ8, KH_HAVE_X86_SIMD */

typedef struct {
    const uint8_t *q;  /* [n/16, k/8, 16, 4] */
    const uint16_t *s; /* [n/16, k/group, 16] */
    const uint16_t *m; /* the same, or NULL (symmetric: m = -8 s) */
    int64_t n, k, group;
} KhTiles;

/* out[r * n + 16 t + j] for rows r0 <= r < r0 + mr (mr 1..4) of x and tiles t0 <= t < t0 + nt
 * (nt >= 1), j < 16. */
typedef void (*KhTileKernel)(const KhTiles *w, int64_t t0, int64_t nt, const KhQ8 *x,
                             int64_t r0, int mr, float *out);

#if KH_HAVE_X86_SIMD
void kh_tiles_avx2(const KhTiles *w, int64_t t0, int64_t nt, const KhQ8 *x, int64_t r0,
                   int mr, float *out);
void kh_tiles_vnni512(const KhTiles *w, int64_t t0, int64_t nt, const KhQ8 *x, int64_t r0,
                      int mr, float *out);
#endif

#endif
