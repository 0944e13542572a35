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

/* out[r * n + 16 t + j] for rows r0 <= r < r0 + mr (mr 1..mr_max, kh_tiles_run) of x and
 * tiles t0 <= t < t0 + nt (nt >= 1), j < 16; w a KhTiles or a KhQ8Tiles, xsum [rows, k/32]
 * the int sums of x's codes per block (read by the Q8_0 kernels only).
 * x, d, gsum and xsum lie in natural order ([rows, ...]), or, for the AVX-512 VNNI kernels,
 * interleaved by row block: the block of mr rows at r0 holds its codes at q + r0 k as
 * [k/8][mr][8] (8 codes of each row in turn), d at d + r0 k/32 as [k/32][mr], gsum at
 * gsum + r0 groups as [groups][mr], xsum at xsum + r0 k/32 as [k/32][mr]. Then one pointer
 * and constant offsets reach every row's x in a chunk: with 8 rows' pointers the compiler ran
 * out of registers and spilled (8 rows of 1536 x 576 in L2, Zen 5: 28.0 -> 20.1 us). */
typedef void (*KhTileKernel)(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                             const int32_t *xsum, int64_t r0, int mr, float *out);

/* The portable kernels' text, and the definition of every W4A8 and W4A16 tile kernel's
 * operations (the comment above): `dot` adds chunk c's exact int32 dots of the tile's 16
 * outputs (its 64 code bytes) with one row of x codes, x_width bytes a row, into dots[16]
 * (kimi_tiles.c W4A8's, k; kimi_tiles_i16.c W4A16's, 2k). */
typedef void (*KhTileChunkDot)(const uint8_t *codes, const int8_t *x_row, int64_t c,
                               int32_t dots[KH_TILE]);
/* Both dots' last step: the tile's 16 rows of 8 codes (64 bytes at p) against x's 8 values. */
static inline void kh_chunk_dots(const uint8_t *p, const int32_t xv[8], int32_t dots[KH_TILE])
{
    int j, i;
    for (j = 0; j < KH_TILE; j++)
        for (i = 0; i < 4; i++)
            dots[j] += (p[4 * j + i] & 0x0f) * xv[i] + (p[4 * j + i] >> 4) * xv[4 + i];
}
void kh_tiles_portable(const KhTiles *w, KhTileChunkDot dot, int64_t x_width, int64_t t0,
                       int64_t nt, const KhQ8 *x, int64_t r0, int mr, float *out);

/* The tile kernels' one driver (kimi_tiles.c): x [rows, k] quantized into work, in natural
 * order or (interleaved) in the row blocks of mr_max rows that the kernel is handed (groups
 * of `group` for gsum; the block sums after, at kh_tiles_work_floats's end), then `kernel`
 * over the n / 16 tiles on the pool, X_CHUNK rows of x at a time, `mr_max` rows a call (4;
 * AVX-512 VNNI up to 8 in a call of at most 8 rows; AMX 16). x_form: KH_X_Q8, KH_X_Q8_SUMS
 * (the kernel reads xsum; else it gets NULL, and no decode step pays for the sums), or
 * KH_X_I16 (W4A16: kh_tiles_i16_quantize's rows, natural order; work kh_tiles_i16_floats). */
#define KH_X_Q8 0
#define KH_X_Q8_SUMS 1
#define KH_X_I16 2
int64_t kh_tiles_work_floats(int64_t rows, int64_t k, int64_t group);
void kh_tiles_run(const void *w, KhTileKernel kernel, int mr_max, int64_t n, int64_t k,
                  int64_t group, int x_form, int interleaved, const float *x, int64_t rows,
                  float *work, float *out, int nthreads);

/* The W4A8 kernel tiles_w4a8 runs for a call of `rows` rows at this CPU's tiles_simd level
 * (AMX too where `amx` and the rows call for it), the most rows it takes a call (mr_max) and
 * whether it reads x interleaved by row block (kimi_tiles.c). */
KhTileKernel kh_tiles_pick(int64_t rows, int amx, int *mr_max, int *interleaved);
/* W4A16 on tiles (kimi_tiles_i16.c): rows rounded to int16 per block of 32, each code as its
 * two bytes. floats: the work `rows` such rows of width k take (-1: a refused shape); at: laid
 * out from base; quantize: src [k] into row `row` of x; copy: row `from` of from_x to row `to`
 * of to_x; pick: this CPU's kernel (x in natural order, at most mr_max rows a call). */
int64_t kh_tiles_i16_floats(int64_t rows, int64_t k, int64_t group);
KhQ8 kh_tiles_i16_at(float *base, int64_t rows, int64_t k, int64_t group);
void kh_tiles_i16_quantize(const float *src, int64_t k, int64_t group, int64_t row,
                           const KhQ8 *x);
void kh_tiles_i16_copy(const KhQ8 *from_x, int64_t from, const KhQ8 *to_x, int64_t to, int64_t k,
                       int64_t group);
KhTileKernel kh_tiles_i16_pick(int *mr_max);

/* Intel AMX (kimi_tiles_amx.c): Linux on x86-64 with a compiler that has its intrinsics;
 * not in the SIMDe build (tests/vnni_emulated.sh), which has no AMX to stand in for. */
#if KH_HAVE_X86_SIMD && defined(__linux__) && !defined(KH_VNNI_EMULATE) \
    && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) \
        || (defined(__clang__) && __clang_major__ >= 12))
#define KH_HAVE_AMX 1
#else
#define KH_HAVE_AMX 0
#endif
#define KH_AMX_ROWS 16 /* x rows per AMX call: a tile's rows */
/* Whether this CPU has AMX-INT8 and Linux lent this process the tiles (asked once). */
int kh_amx_ready(void);
/* Whether a call of `rows` rows at tiles_simd level `level` runs AMX (from min_rows, the
 * switch on, the tiles lent): counted in tiles_amx_calls when it does (kimi_tiles.c). */
int kh_amx_call(int64_t rows, int64_t min_rows, int level);
#if KH_HAVE_AMX
void kh_tiles_amx(const void *w, int64_t t0, int64_t nt, const KhQ8 *x, const int32_t *xsum,
                  int64_t r0, int mr, float *out);
void kh_q8_tiles_amx(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                     const int32_t *xsum, int64_t r0, int mr, float *out);
#endif

/* A Q8_0 matrix in tiles (see kimi_helper.h, tiles_q8): q [n/16, k/4, 16, 4] int8 (4 inputs
 * of 16 rows per 64 bytes), s [n/16, k/32, 16] half bits. Each output (r, row):
 *     acc = 0; per block b: acc = fma((float) dot_b, s_b * d_b, acc)
 * with xsum the int sums of x's codes per block (vpdpbusd meets w + 128; laid out as x). */
typedef struct {
    const int8_t *q;
    const uint16_t *s;
    int64_t n, k;
} KhQ8Tiles;

/* The entry points of one tile kernel set, written once for both (kimi_tiles_simd.c,
 * kimi_q8_tiles_simd.c): NAME512 (prefill: blocks of several tiles over W in L2), NAME512_DECODE
 * (a call of at most KH_TILES_MR512 rows: one tile at a time, so each thread reads W as one
 * stream; four tiles' streams of codes, scales and mins at once left the memory idle: one row
 * of a 49152 x 576 linear, 2 threads, Zen 5: 41 -> 52 GB/s, 2 rows 31 -> 50 GB/s; in L2 one
 * tile at a time is 5-15% slower, and decode's W is never there) and NAME2 (AVX2).
 * The includer defines TARGET512, TARGET2 and the bodies
 *   body512(w, t0, NT, x, xsum, r0, MR, out): MR rows x NT tiles (AVX-512 VNNI), and
 *   body2(w, t, x, r0, MR, out): MR rows x one tile (AVX2),
 * inlined per (MR, NT) so that the accumulators stay in registers. AVX-512 prefill: blocks of
 * 4 tiles for one or two rows, else 2 and 1; decode one; AVX2: rows in pairs. */
#define KH_TILES_BLOCK512(TILES, MR, NT)                                                       \
    static TARGET512 void block512_##MR##_##NT(const TILES *w, int64_t t0, const KhQ8 *x,      \
                                              const int32_t *xsum, int64_t r0, float *out)     \
    {                                                                                          \
        body512(w, t0, NT, x, xsum, r0, MR, out);                                              \
    }
#define KH_TILES_MR512 8 /* x rows a call of the AVX-512 kernels may take as one block */
/* Bytes ahead in each tile's stream of codes that the AVX-512 kernels prefetch. SmolLM2's
 * projections from memory, AMD EPYC Zen 5, 2 threads, against 1024: 8 rows 2.44 -> 2.19 ms;
 * one tile at a time (the decode entry), against 2048: 1 row 1.39 -> 1.34 ms, 2 rows 1.54 ->
 * 1.41, 4 rows 1.72 -> 1.62; prefill's blocks the same within noise. */
#define KH_TILES_PREFETCH 4096
#define KH_TILES_ENTRIES(TILES, NAME512, NAME512_DECODE, NAME2)                                \
    KH_TILES_BLOCK512(TILES, 1, 1) KH_TILES_BLOCK512(TILES, 2, 1)                              \
    KH_TILES_BLOCK512(TILES, 3, 1) KH_TILES_BLOCK512(TILES, 4, 1)                              \
    KH_TILES_BLOCK512(TILES, 5, 1) KH_TILES_BLOCK512(TILES, 6, 1)                              \
    KH_TILES_BLOCK512(TILES, 7, 1) KH_TILES_BLOCK512(TILES, 8, 1)                              \
    KH_TILES_BLOCK512(TILES, 1, 2) KH_TILES_BLOCK512(TILES, 2, 2)                              \
    KH_TILES_BLOCK512(TILES, 3, 2) KH_TILES_BLOCK512(TILES, 4, 2)                              \
    KH_TILES_BLOCK512(TILES, 1, 4) KH_TILES_BLOCK512(TILES, 2, 4)                              \
    /* wide: blocks of 4 and 2 tiles where the rows allow (prefill), else one tile at a time */ \
    static TARGET512 void blocks512(const TILES *w, int64_t t, int64_t end, const KhQ8 *x,      \
                                    const int32_t *xsum, int64_t r0, int mr, float *out,         \
                                    int wide)                                                    \
    {                                                                                          \
        typedef void (*Block)(const TILES *, int64_t, const KhQ8 *, const int32_t *, int64_t,  \
                              float *);                                                        \
        static const Block by1[9] = {0, block512_1_1, block512_2_1, block512_3_1, block512_4_1, \
                                     block512_5_1, block512_6_1, block512_7_1, block512_8_1}; \
        static const Block by2[5] = {0, block512_1_2, block512_2_2, block512_3_2, block512_4_2}; \
        static const Block by4[3] = {0, block512_1_4, block512_2_4};                           \
        if (wide && mr <= 2)                                                                   \
            for (; t + 4 <= end; t += 4) by4[mr](w, t, x, xsum, r0, out);                      \
        if (wide && mr <= 4)                                                                   \
            for (; t + 2 <= end; t += 2) by2[mr](w, t, x, xsum, r0, out);                      \
        for (; t < end; t++) by1[mr](w, t, x, xsum, r0, out);                                  \
    }                                                                                          \
    TARGET512 void NAME512(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,           \
                           const int32_t *xsum, int64_t r0, int mr, float *out)                \
    {                                                                                          \
        blocks512(tiles, t0, t0 + nt, x, xsum, r0, mr, out, 1);                                \
    }                                                                                          \
    TARGET512 void NAME512_DECODE(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,    \
                                  const int32_t *xsum, int64_t r0, int mr, float *out)         \
    {                                                                                          \
        blocks512(tiles, t0, t0 + nt, x, xsum, r0, mr, out, 0);                                \
    }                                                                                          \
    static TARGET2 void block2_1(const TILES *w, int64_t t, const KhQ8 *x, int64_t r0, float *out) \
    {                                                                                          \
        body2(w, t, x, r0, 1, out);                                                            \
    }                                                                                          \
    static TARGET2 void block2_2(const TILES *w, int64_t t, const KhQ8 *x, int64_t r0, float *out) \
    {                                                                                          \
        body2(w, t, x, r0, 2, out);                                                            \
    }                                                                                          \
    TARGET2 void NAME2(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,               \
                       const int32_t *xsum, int64_t r0, int mr, float *out)                    \
    {                                                                                          \
        const TILES *w = tiles;                                                                \
        int64_t t;                                                                             \
        int r;                                                                                 \
        (void)xsum; /* AVX2 takes the plain dot */                                             \
        for (t = t0; t < t0 + nt; t++) {                                                       \
            for (r = 0; r + 2 <= mr; r += 2) block2_2(w, t, x, r0 + r, out);                   \
            if (r < mr) block2_1(w, t, x, r0 + r, out);                                        \
        }                                                                                      \
    }

#if KH_HAVE_X86_SIMD
void kh_q8_tiles_avx2(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                      const int32_t *xsum, int64_t r0, int mr, float *out);
void kh_q8_tiles_vnni512(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                         const int32_t *xsum, int64_t r0, int mr, float *out);
void kh_q8_tiles_vnni512_decode(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                                const int32_t *xsum, int64_t r0, int mr, float *out);
void kh_tiles_avx2(const void *w, int64_t t0, int64_t nt, const KhQ8 *x, const int32_t *xsum,
                   int64_t r0, int mr, float *out);
void kh_tiles_vnni512(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                      const int32_t *xsum, int64_t r0, int mr, float *out);
void kh_tiles_vnni512_decode(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                             const int32_t *xsum, int64_t r0, int mr, float *out);
void kh_tiles_i16_avx2(const void *w, int64_t t0, int64_t nt, const KhQ8 *x, const int32_t *xsum,
                       int64_t r0, int mr, float *out);
void kh_tiles_i16_vnni512(const void *w, int64_t t0, int64_t nt, const KhQ8 *x,
                          const int32_t *xsum, int64_t r0, int mr, float *out);
#endif

#endif
