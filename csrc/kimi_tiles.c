/* kimi_tiles.c: W4A8 on weights in tiles, any number of x rows (see kimi_helper.h,
 * tiles_w4a8, and kimi_tiles.h for the layout and the operations).
 *
 * The row-major W4A8 kernels (kimi_int8_body.h) take one weight row at a time: per x row and
 * 64 inputs, two x loads, two vpdpbusd, a convert, two lane permutes and two FMAs, and a
 * horizontal sum per output; a verify step of 8 rows cost 3.5x a one-row step. Here 16
 * output rows share every instruction: per x row and 8 inputs of 16 rows, two broadcasts and
 * two vpdpbusd; per block of 32, a convert, a multiply and an FMA per 16 outputs.
 *
 * One kernel serves decode (1 row), a verify step (k + 1 rows) and prefill (any rows): rows
 * go in register blocks (all of a call of up to 8 rows; else 4; AMX 16) over a block of tiles
 * that stays in L2, so W is read from memory once per call. */
#include "kimi_helper.h"
#include "kimi_tiles.h"

#include <math.h>

#define X_CHUNK 64 /* x rows per pass over a block of tiles (their codes stay in L2) */
/* a whole number of prefill's blocks of 4 rows: quantize_rows lays x out in the blocks that
 * tiles_rows hands the kernel, and both count them from row 0 (AMX's 16 read natural order) */
typedef char kh_x_chunk_holds_whole_row_blocks[X_CHUNK % 4 == 0 ? 1 : -1];
#define TILE_BLOCK_BYTES (192 << 10) /* codes of the tiles met by each chunk of x rows (L2) */

void kh_tiles_portable(const KhTiles *w, KhTileChunkDot dot, int64_t x_width, int64_t t0,
                       int64_t nt, const KhQ8 *x, int64_t r0, int mr, float *out)
{
    int64_t k = w->k, groups = k / w->group, per_group = w->group / KH_Q8_BLOCK;
    int64_t nb = k / KH_Q8_BLOCK, chunks = k / 8, t, r, g, b, c;
    int j;
    for (t = t0; t < t0 + nt; t++)
        for (r = r0; r < r0 + mr; r++) {
            float acc[KH_TILE] = {0};
            for (g = 0; g < groups; g++) {
                const uint16_t *s = w->s + (t * groups + g) * KH_TILE;
                const uint16_t *m = w->m ? w->m + (t * groups + g) * KH_TILE : NULL;
                for (b = g * per_group; b < (g + 1) * per_group; b++) {
                    int32_t dots[KH_TILE] = {0};
                    float d = x->d[r * nb + b];
                    for (c = 4 * b; c < 4 * b + 4; c++)
                        dot(w->q + (t * chunks + c) * KH_TILE * 4, x->q + r * x_width, c, dots);
                    for (j = 0; j < KH_TILE; j++)
                        acc[j] = fmaf((float)dots[j], kh_half_to_float(s[j]) * d, acc[j]);
                }
                for (j = 0; j < KH_TILE; j++)
                    acc[j] = fmaf(m ? kh_half_to_float(m[j])
                                    : KH_SYMMETRIC_MIN(kh_half_to_float(s[j])),
                                  x->gsum[r * groups + g], acc[j]);
            }
            for (j = 0; j < KH_TILE; j++) out[r * w->n + t * KH_TILE + j] = acc[j];
        }
}

/* W4A8's chunk dot: x's int8 codes in natural order. */
static void chunk_dot_q8(const uint8_t *p, const int8_t *x_row, int64_t c,
                         int32_t dots[KH_TILE])
{
    int32_t xv[8];
    int i;
    for (i = 0; i < 8; i++) xv[i] = x_row[8 * c + i];
    kh_chunk_dots(p, xv, dots);
}

/* The portable W4A8 kernel. */
static void tiles_c(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,
                    const int32_t *xsum, int64_t r0, int mr, float *out)
{
    const KhTiles *w = tiles;
    (void)xsum;
    kh_tiles_portable(w, chunk_dot_q8, w->k, t0, nt, x, r0, mr, out);
}

int64_t tiles_w4a8_work_floats(int64_t rows, int64_t k, int64_t group)
{
    if (rows <= 0 || k <= 0 || group <= 0 || group % KH_Q8_BLOCK || k % group) return -1;
    return kh_tiles_work_floats(rows, k, group);
}

int64_t kh_tiles_work_floats(int64_t rows, int64_t k, int64_t group)
{
    return kh_q8_floats(rows, k, group) + rows * (k / KH_Q8_BLOCK); /* + the block sums */
}

typedef struct {
    const void *w;
    KhTileKernel kernel;
    int mr_max;
    int64_t n, k, group, rows;
    int interleaved; /* x in the kernel's row blocks (kimi_tiles.h), else in natural order */
    int i16;         /* x rounded to int16 (kh_tiles_i16_quantize), else to int8 */
    KhQ8 x;
    int32_t *xsum;
    const float *xf;
    float *out;
} TilesJob;

/* Rows [begin, end) of x quantized, in natural order or in the kernel's row blocks of
 * mr_max rows (the last may be shorter: the blocks tiles_rows hands the kernel), and their
 * blocks' code sums when the kernel reads them. */
static void quantize_rows(void *ctx, int64_t begin, int64_t end)
{
    const TilesJob *job = ctx;
    int64_t k = job->k, nb = k / KH_Q8_BLOCK, groups = k / job->group, i, r;
    int j;
    if (job->i16) { /* W4A16: int16 codes as their bytes, natural order */
        for (r = begin; r < end; r++)
            kh_tiles_i16_quantize(job->xf + r * k, k, job->group, r, &job->x);
        return;
    }
    if (job->interleaved) {
        for (r = begin; r < end; r++) {
            int64_t r0 = r - r % job->mr_max;
            int64_t mr = job->rows - r0 < job->mr_max ? job->rows - r0 : job->mr_max;
            KhQ8 block = {job->x.q + r0 * k, job->x.d + r0 * nb, job->x.gsum + r0 * groups};
            kh_quantize_q8_lane(job->xf + r * k, k, job->group, mr, r - r0, &block,
                                job->xsum ? job->xsum + r0 * nb : NULL);
        }
        return;
    }
    {
        KhQ8 part = {job->x.q + begin * k, job->x.d + begin * nb, job->x.gsum + begin * groups};
        kh_quantize_q8(job->xf + begin * k, end - begin, k, job->group, 0, &part);
    }
    for (i = begin * nb; job->xsum && i < end * nb; i++) {
        int32_t sum = 0;
        for (j = 0; j < KH_Q8_BLOCK; j++) sum += job->x.q[i * KH_Q8_BLOCK + j];
        job->xsum[i] = sum;
    }
}

/* Tiles [t0, end) in blocks of about TILE_BLOCK_BYTES of codes; per block, X_CHUNK rows of
 * x at a time in register blocks of mr_max rows, so each block comes from memory once per call and
 * from L2 for the other row blocks (the order of the blocks changes no output's operations). */
static void tiles_rows(void *ctx, int64_t t0, int64_t end)
{
    const TilesJob *job = ctx;
    int64_t per_block = TILE_BLOCK_BYTES / (KH_TILE * job->k / 2), b0, c0, r;
    if (per_block < 1) per_block = 1;
    for (b0 = t0; b0 < end; b0 += per_block) {
        int64_t b1 = b0 + per_block < end ? b0 + per_block : end;
        for (c0 = 0; c0 < job->rows; c0 += X_CHUNK) {
            int64_t c1 = c0 + X_CHUNK < job->rows ? c0 + X_CHUNK : job->rows;
            for (r = c0; r < c1; r += job->mr_max)
                job->kernel(job->w, b0, b1 - b0, &job->x, job->xsum, r,
                            c1 - r < job->mr_max ? (int)(c1 - r) : job->mr_max, job->out);
        }
    }
}

void kh_tiles_run(const void *w, KhTileKernel kernel, int mr_max, int64_t n, int64_t k,
                  int64_t group, int x_form, int interleaved, const float *x, int64_t rows,
                  float *work, float *out, int nthreads)
{
    TilesJob job = {.w = w, .kernel = kernel, .mr_max = mr_max, .n = n, .k = k,
                    .group = group, .rows = rows, .xf = x, .out = out};
    job.i16 = x_form == KH_X_I16;
    job.interleaved = interleaved && mr_max > 1 && !job.i16; /* blocks of one row: natural */
    job.x = job.i16 ? kh_tiles_i16_at(work, rows, k, group) : kh_q8_at(work, rows, k, group);
    job.xsum = x_form == KH_X_Q8_SUMS ? (int32_t *)(work + kh_q8_floats(rows, k, group)) : NULL;
    if (rows >= 16 && nthreads > 1) /* prefill: quantizing is ~5% of the work */
        kh_parallel_split(quantize_rows, &job, rows, (rows + 2 * nthreads - 1) / (2 * nthreads),
                          nthreads, 1);
    else
        quantize_rows(&job, 0, rows);
    kh_parallel_rows(tiles_rows, &job, n / KH_TILE, n * k * rows, nthreads, 1);
}

int tiles_simd(void)
{
#if KH_HAVE_X86_SIMD
    int level = w4a8_simd(-1);
    if (level >= 3) return 3;
    if (level >= 1) return 1;
#endif
    return 0;
}

static int amx_allowed = 1; /* tiles_amx's switch */
static int64_t amx_calls;

int64_t tiles_amx_calls(void)
{
    return __atomic_load_n(&amx_calls, __ATOMIC_RELAXED);
}

/* AMX for a call at this tiles_simd level: the switch on, AVX-512 VNNI's level, tiles lent. */
static int amx_runs(int level)
{
    return amx_allowed && level == 3 && kh_amx_ready();
}

int kh_amx_call(int64_t rows, int64_t min_rows, int level)
{
    if (rows < min_rows || !amx_runs(level)) return 0;
    __atomic_fetch_add(&amx_calls, 1, __ATOMIC_RELAXED);
    return 1;
}

int tiles_amx(int mode)
{
    if (mode == 0 || mode == 1) amx_allowed = mode;
    return amx_runs(tiles_simd());
}

KhTileKernel kh_tiles_pick(int64_t rows, int amx, int *mr_max, int *interleaved)
{
    KhTileKernel kernel = tiles_c;
    int level = tiles_simd();
    *mr_max = 4, *interleaved = 0;
#if KH_HAVE_X86_SIMD
    switch (level) {
    case 3: /* a verify step's 5..8 rows as one block: W unpacked once, not twice (5-7 rows
             * 4-5% faster a step); prefill keeps blocks of 4 rows by 2 tiles (8 by 1 was
             * 3-10% slower a chunk) */
        kernel = rows <= KH_TILES_MR512 ? kh_tiles_vnni512_decode : kh_tiles_vnni512;
        *mr_max = rows <= KH_TILES_MR512 ? (int)rows : 4;
        *interleaved = 1;
        break;
    case 1: kernel = kh_tiles_avx2; break;
    default: break;
    }
#endif
#if KH_HAVE_AMX
    if (amx && kh_amx_call(rows, KH_AMX_MIN_ROWS, level)) {
        kernel = kh_tiles_amx;
        *mr_max = KH_AMX_ROWS;
        *interleaved = 0;
    }
#else
    (void)amx;
#endif
    return kernel;
}

/* tiles_w4a8 and tiles_w4a16: the same checks and driver, x rounded to int8 or to int16. */
static int tiles_call(int i16, const float *x, int64_t rows, const uint8_t *tq,
                      const uint16_t *ts, const uint16_t *tm, int64_t n, int64_t k,
                      int64_t group, float *work, float *out, int nthreads)
{
    KhTiles w = {tq, ts, tm, n, k, group};
    KhTileKernel kernel;
    int mr_max, interleaved = 0;
    if (rows <= 0 || n <= 0 || n % KH_TILE || k % 8 || nthreads <= 0) return KH_EINVAL;
    if ((i16 ? tiles_w4a16_work_floats : tiles_w4a8_work_floats)(rows, k, group) < 0)
        return KH_EINVAL;
    if (!x || !tq || !ts || !work || !out) return KH_EINVAL;
    kernel = i16 ? kh_tiles_i16_pick(&mr_max) : kh_tiles_pick(rows, 1, &mr_max, &interleaved);
    kh_tiles_run(&w, kernel, mr_max, n, k, group, i16 ? KH_X_I16 : KH_X_Q8, interleaved, x,
                 rows, work, out, nthreads);
    return KH_OK;
}

int tiles_w4a8(const float *x, int64_t rows, const uint8_t *tq, const uint16_t *ts,
               const uint16_t *tm, int64_t n, int64_t k, int64_t group, float *work, float *out,
               int nthreads)
{
    return tiles_call(0, x, rows, tq, ts, tm, n, k, group, work, out, nthreads);
}

int64_t tiles_w4a16_work_floats(int64_t rows, int64_t k, int64_t group)
{
    if (rows <= 0) return -1;
    return kh_tiles_i16_floats(rows, k, group);
}

int tiles_w4a16(const float *x, int64_t rows, const uint8_t *tq, const uint16_t *ts,
                const uint16_t *tm, int64_t n, int64_t k, int64_t group, float *work,
                float *out, int nthreads)
{
    return tiles_call(1, x, rows, tq, ts, tm, n, k, group, work, out, nthreads);
}
