/* The W4A8 tile kernel (kimi_tiles.h) on Intel AMX, up to 16 rows of x at once, for calls of
 * KH_AMX_MIN_ROWS rows or more (tiles_w4a8): long verify steps and prefill; and the Q8_0
 * head's (tiles_q8, from KH_Q8_AMX_MIN_ROWS rows), whose B tiles are its codes as they lie.
 * One TDPBSUD takes a block of 32 inputs of up to 16 x rows (signed codes, tile A, read in
 * place from x's codes) against the same 32 inputs of one tile's 16 output rows (unsigned
 * nibbles, tile B): 16 x 16 exact int32 dots, where AVX-512 VNNI spends 8 vpdpbusd per x row.
 * The float steps then run per x row on those dots exactly as kimi_tiles_simd.c's do (a cvt,
 * s * d, an FMA per block; m * gsum per group), so every output has tiles_c's bits and a
 * row's result does not depend on its batch.
 *
 * B for one block is built in a 512-byte buffer: chunk c of the block (8 inputs, 64 bytes,
 * 4 per output row) gives B's row 2c (its low nibbles: inputs 8c..8c+3 of the 16 rows, the
 * 4-bytes-per-column pairs TDPBSUD reads) and row 2c + 1 (high nibbles: 8c+4..8c+7).
 *
 * Linux lends the tile registers to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM);
 * kh_amx_ready asks once and says whether the CPU has AMX-INT8 and the kernel gave it. Each
 * call loads its tile shape and releases the tiles before it returns, so a thread that is
 * switched out between calls saves no tile state. */
#define _GNU_SOURCE
#include "kimi_tiles.h"

#include <pthread.h>

#if KH_HAVE_AMX
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_PREFETCH 1024 /* bytes ahead in the tile's stream of codes */

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    unsigned a, b, c, d, lo, hi;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return; /* AMX-TILE, AMX-INT8 */
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!(c & (1u << 27))) return; /* OSXSAVE: xgetbv is there */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    amx_ok = (lo & (3u << 17)) == (3u << 17); /* XTILECFG and XTILEDATA enabled */
}

int kh_amx_ready(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

#define AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx2,fma,f16c,avx512f,avx512bw")))
/* Tile registers (numbers: the intrinsics paste them into the instruction's text), two sets
 * so that block b + 1's dots are under way while block b's are stored and scaled: one set a
 * block, each dot a chain of tile load, multiply and store that one block alone would wait
 * out. */
#define TC0 0 /* the dots [MR, 16] int32 */
#define TA0 1 /* x's codes [MR, 32] int8 */
#define TB0 2 /* W's nibbles [8, 64]: 4 inputs of 16 output rows per row */
#define TC1 3
#define TA1 4
#define TB1 5

/* B for block b of the tile at tq into buf [8][64] (see the top). */
static AMX_TARGET inline __attribute__((always_inline)) void unpack_block(const uint8_t *tq,
                                                                          int64_t b,
                                                                          uint8_t buf[8][64])
{
    const __m512i mask = _mm512_set1_epi8(0x0f);
    int c;
    for (c = 0; c < 4; c++) {
        const uint8_t *p = tq + (4 * b + c) * 64;
        __m512i raw = _mm512_loadu_si512((const void *)p);
        _mm_prefetch((const char *)(p + TILE_PREFETCH), _MM_HINT_T0);
        _mm512_store_si512((void *)buf[2 * c], _mm512_and_si512(raw, mask));
        _mm512_store_si512((void *)buf[2 * c + 1],
                           _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask));
    }
}

/* acc[r] = fma(float(dot_r), s * d_r, acc[r]) for block bi of rows r0..r0+MR-1: the float
 * step both kernels share (their dots [MR][16] from the tiles, s the block's 16 scales). */
static AMX_TARGET inline __attribute__((always_inline)) void scale_dots(
    __m512 s, const KhQ8 *x, int64_t r0, const int MR, int64_t nb, int64_t bi,
    int32_t dots[16][16], __m512 *acc)
{
    int r;
    for (r = 0; r < MR; r++) {
        __m512 d = _mm512_set1_ps(x->d[(r0 + r) * nb + bi]);
        __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)dots[r]));
        acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s, d), acc[r]);
    }
}

/* The float steps of block bi (its dots [MR][16] from the tiles) into acc, in tiles_c's order:
 * a group's scales at its first block, its mins after its last. */
static AMX_TARGET inline __attribute__((always_inline)) void scale_block(
    const KhTiles *w, int64_t t, const KhQ8 *x, int64_t r0, const int MR, int64_t bi,
    int32_t dots[16][16], __m512 *s, __m512 *m, __m512 *acc)
{
    const int64_t groups = w->k / w->group, per_group = w->group / KH_Q8_BLOCK;
    const int64_t nb = w->k / KH_Q8_BLOCK, g = bi / per_group;
    int r;
    if (bi % per_group == 0) {
        int64_t at = (t * groups + g) * KH_TILE;
        *s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->s + at)));
        *m = w->m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->m + at)))
                  : _mm512_mul_ps(*s, _mm512_set1_ps(-8.0f));
    }
    scale_dots(*s, x, r0, MR, nb, bi, dots, acc);
    if (bi % per_group == per_group - 1)
        for (r = 0; r < MR; r++)
            acc[r] = _mm512_fmadd_ps(*m, _mm512_set1_ps(x->gsum[(r0 + r) * groups + g]), acc[r]);
}

/* tiles_q8's float step for block bi (its dots [MR][16] from the tiles) into acc. */
static AMX_TARGET inline __attribute__((always_inline)) void scale_q8_block(
    const KhQ8Tiles *w, int64_t t, const KhQ8 *x, int64_t r0, const int MR, int64_t bi,
    int32_t dots[16][16], __m512 *acc)
{
    const int64_t nb = w->k / KH_Q8_BLOCK;
    const uint16_t *s = w->s + (t * nb + bi) * KH_TILE;
    scale_dots(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)), x, r0, MR, nb, bi, dots,
               acc);
}

/* One tile, MR rows: blocks in pairs, a pair's B unpacked one pair ahead and its dots scaled
 * one pair behind, so that no tile load waits on the stores it reads, nor a vector load on
 * the tile store it reads (each waits for the data to reach the cache). */
static AMX_TARGET inline __attribute__((always_inline)) void body_amx(
    const KhTiles *w, int64_t t, const KhQ8 *x, int64_t r0, const int MR, float *out)
{
    const int64_t k = w->k, nb = k / KH_Q8_BLOCK, chunks = k / 8;
    const uint8_t *tq = w->q + t * chunks * 64;
    const int8_t *xq = x->q + r0 * k;
    uint8_t bbuf[4][8][64] __attribute__((aligned(64))); /* blocks by b % 4 */
    int32_t dots[4][16][16] __attribute__((aligned(64)));
    __m512 acc[16], s = _mm512_setzero_ps(), m = s;
    int64_t b;
    int r;
    for (r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (b = 0; b < nb && b < 2; b++) unpack_block(tq, b, bbuf[b]);
    for (b = 0; b < nb; b += 2) {
        int two = b + 1 < nb;
        if (b + 2 < nb) unpack_block(tq, b + 2, bbuf[(b + 2) % 4]);
        if (b + 3 < nb) unpack_block(tq, b + 3, bbuf[(b + 3) % 4]);
        _tile_loadd(TB0, bbuf[b % 4], 64);
        _tile_loadd(TA0, xq + b * KH_Q8_BLOCK, k);
        _tile_zero(TC0);
        _tile_dpbsud(TC0, TA0, TB0);
        if (two) {
            _tile_loadd(TB1, bbuf[(b + 1) % 4], 64);
            _tile_loadd(TA1, xq + (b + 1) * KH_Q8_BLOCK, k);
            _tile_zero(TC1);
            _tile_dpbsud(TC1, TA1, TB1);
        }
        _tile_stored(TC0, dots[b % 4], 64);
        if (two) _tile_stored(TC1, dots[(b + 1) % 4], 64);
        if (b >= 2) { /* the pair before: blocks b - 2 and b - 1 */
            scale_block(w, t, x, r0, MR, b - 2, dots[(b - 2) % 4], &s, &m, acc);
            scale_block(w, t, x, r0, MR, b - 1, dots[(b - 1) % 4], &s, &m, acc);
        }
    }
    for (b = (nb - 1) / 2 * 2; b < nb; b++) /* the last pair (or single block) */
        scale_block(w, t, x, r0, MR, b, dots[b % 4], &s, &m, acc);
    for (r = 0; r < MR; r++) _mm512_storeu_ps(out + (r0 + r) * w->n + t * KH_TILE, acc[r]);
}

/* One Q8_0 tile (KhQ8Tiles), MR rows: as body_amx, with B read in place (a block's 8 chunks
 * of 16 rows x 4 signed codes are TDPBSSD's B as they lie) and tiles_q8's float steps. */
static AMX_TARGET inline __attribute__((always_inline)) void body_q8_amx(
    const KhQ8Tiles *w, int64_t t, const KhQ8 *x, int64_t r0, const int MR, float *out)
{
    const int64_t k = w->k, nb = k / KH_Q8_BLOCK, block_bytes = 8 * 64;
    const int8_t *tq = w->q + t * (k / 4) * 64, *xq = x->q + r0 * k;
    int32_t dots[4][16][16] __attribute__((aligned(64)));
    __m512 acc[16];
    int64_t b;
    int r;
    for (r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (b = 0; b < nb; b += 2) {
        int two = b + 1 < nb, line;
        for (line = 0; line < 16; line++)
            _mm_prefetch((const char *)(tq + (b + 4) * block_bytes + 64 * line), _MM_HINT_T0);
        _tile_loadd(TB0, tq + b * block_bytes, 64);
        _tile_loadd(TA0, xq + b * KH_Q8_BLOCK, k);
        _tile_zero(TC0);
        _tile_dpbssd(TC0, TA0, TB0);
        if (two) {
            _tile_loadd(TB1, tq + (b + 1) * block_bytes, 64);
            _tile_loadd(TA1, xq + (b + 1) * KH_Q8_BLOCK, k);
            _tile_zero(TC1);
            _tile_dpbssd(TC1, TA1, TB1);
        }
        _tile_stored(TC0, dots[b % 4], 64);
        if (two) _tile_stored(TC1, dots[(b + 1) % 4], 64);
        if (b >= 2) { /* the pair before */
            scale_q8_block(w, t, x, r0, MR, b - 2, dots[(b - 2) % 4], acc);
            scale_q8_block(w, t, x, r0, MR, b - 1, dots[(b - 1) % 4], acc);
        }
    }
    for (b = (nb - 1) / 2 * 2; b < nb; b++)
        scale_q8_block(w, t, x, r0, MR, b, dots[b % 4], acc);
    for (r = 0; r < MR; r++) _mm512_storeu_ps(out + (r0 + r) * w->n + t * KH_TILE, acc[r]);
}

typedef void (*AmxBlock)(const void *, int64_t, const KhQ8 *, int64_t, float *);
#define AMX_BLOCK(NAME, BODY, TILES, MR)                                                       \
    static AMX_TARGET void NAME##_##MR(const void *w, int64_t t, const KhQ8 *x, int64_t r0,    \
                                      float *out)                                              \
    {                                                                                          \
        BODY((const TILES *)w, t, x, r0, MR, out);                                             \
    }
#define AMX_BLOCKS(NAME, BODY, TILES)                                                          \
    AMX_BLOCK(NAME, BODY, TILES, 1) AMX_BLOCK(NAME, BODY, TILES, 2)                            \
    AMX_BLOCK(NAME, BODY, TILES, 3) AMX_BLOCK(NAME, BODY, TILES, 4)                            \
    AMX_BLOCK(NAME, BODY, TILES, 5) AMX_BLOCK(NAME, BODY, TILES, 6)                            \
    AMX_BLOCK(NAME, BODY, TILES, 7) AMX_BLOCK(NAME, BODY, TILES, 8)                            \
    AMX_BLOCK(NAME, BODY, TILES, 9) AMX_BLOCK(NAME, BODY, TILES, 10)                           \
    AMX_BLOCK(NAME, BODY, TILES, 11) AMX_BLOCK(NAME, BODY, TILES, 12)                          \
    AMX_BLOCK(NAME, BODY, TILES, 13) AMX_BLOCK(NAME, BODY, TILES, 14)                          \
    AMX_BLOCK(NAME, BODY, TILES, 15) AMX_BLOCK(NAME, BODY, TILES, 16)                          \
    static const AmxBlock NAME[17] = {0, NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5,     \
                                      NAME##_6, NAME##_7, NAME##_8, NAME##_9, NAME##_10,       \
                                      NAME##_11, NAME##_12, NAME##_13, NAME##_14, NAME##_15,   \
                                      NAME##_16};
AMX_BLOCKS(w4a8_blocks, body_amx, KhTiles)
AMX_BLOCKS(q8_blocks, body_q8_amx, KhQ8Tiles)

/* mr 1..KH_AMX_ROWS rows of x (1: the last of a batch) by tiles t0..t0+nt-1 (kimi_tiles.c's
 * driver gives one call per block of tiles and group of rows): both kernels' tile shapes are
 * the same (A [mr, 32] int8, B [8, 64], C [mr, 16] int32). */
static AMX_TARGET void run_amx(const AmxBlock *by_rows, const void *w, int64_t t0, int64_t nt,
                               const KhQ8 *x, int64_t r0, int mr, float *out)
{
    TileConfig cfg;
    int64_t t;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[TC0] = cfg.rows[TC1] = (uint8_t)mr, cfg.colsb[TC0] = cfg.colsb[TC1] = 64;
    cfg.rows[TA0] = cfg.rows[TA1] = (uint8_t)mr;
    cfg.colsb[TA0] = cfg.colsb[TA1] = KH_Q8_BLOCK;
    cfg.rows[TB0] = cfg.rows[TB1] = KH_Q8_BLOCK / 4, cfg.colsb[TB0] = cfg.colsb[TB1] = 64;
    _tile_loadconfig(&cfg);
    for (t = t0; t < t0 + nt; t++) by_rows[mr](w, t, x, r0, out);
    _tile_release();
}

void kh_tiles_amx(const void *w, int64_t t0, int64_t nt, const KhQ8 *x, const int32_t *xsum,
                  int64_t r0, int mr, float *out)
{
    (void)xsum;
    run_amx(w4a8_blocks, w, t0, nt, x, r0, mr, out);
}

void kh_q8_tiles_amx(const void *w, int64_t t0, int64_t nt, const KhQ8 *x, const int32_t *xsum,
                     int64_t r0, int mr, float *out)
{
    (void)xsum; /* TDPBSSD takes the signed codes as they are */
    run_amx(q8_blocks, w, t0, nt, x, r0, mr, out);
}

#else
int kh_amx_ready(void)
{
    return 0;
}
#endif
