/* kimi_q8_tiles.c: the Q8_0 LM head on weights in tiles, any number of x rows (see
 * kimi_helper.h, tiles_q8, and kimi_tiles.h). The row-major head (kimi_q8.c) costs a full
 * pass of its per-row work for every row of a verify step: 0.82 ms at one row, 2.73 ms at 8
 * for SmolLM2's 49152 x 576. In tiles 16 vocabulary rows share each instruction, as the INT4
 * projections do (kimi_tiles.c); the signed weights meet vpdpbusd as w + 128 (unsigned), and
 * the dot starts at -128 * sum(x's codes in the block), so it is the exact int32 dot.
 * Intel AMX takes calls of KH_Q8_AMX_MIN_ROWS or more (kimi_tiles_amx.c, the same bits): with
 * SmolLM2's head hot in cache, on the 2-core Xeon, 8 rows 0.77 ms against AVX-512 VNNI's 0.88
 * (in one block of 8 rows; 1.08 in two of 4, as before), 6 rows 0.71-0.76 against 0.74-0.78,
 * 4 rows the same 0.70; one row 0.67. */
#include "kimi_helper.h"
#include "kimi_tiles.h"

#include <math.h>

/* The portable kernel, and the definition of every kernel's operations. */
static void q8_tiles_c(const void *tiles, int64_t t0, int64_t nt, const KhQ8 *x,
                       const int32_t *xsum, int64_t r0, int mr, float *out)
{
    const KhQ8Tiles *w = tiles;
    int64_t k = w->k, nb = k / KH_Q8_BLOCK, chunks = k / 4, t, r, b, c;
    int j, i;
    (void)xsum; /* the plain dot needs no offset */
    for (t = t0; t < t0 + nt; t++)
        for (r = r0; r < r0 + mr; r++)
            for (j = 0; j < KH_TILE; j++) {
                float acc = 0.0f;
                for (b = 0; b < nb; b++) {
                    float s = kh_half_to_float(w->s[(t * nb + b) * KH_TILE + j]);
                    int32_t dot = 0;
                    for (c = 8 * b; c < 8 * b + 8; c++)
                        for (i = 0; i < 4; i++)
                            dot += w->q[((t * chunks + c) * KH_TILE + j) * 4 + i]
                                   * x->q[r * k + 4 * c + i];
                    acc = fmaf((float)dot, s * x->d[r * nb + b], acc);
                }
                out[r * w->n + t * KH_TILE + j] = acc;
            }
}

int64_t tiles_q8_work_floats(int64_t rows, int64_t k)
{
    if (rows <= 0 || k <= 0 || k % KH_Q8_BLOCK) return -1;
    return kh_tiles_work_floats(rows, k, k); /* one gsum per row, unused: no min term */
}

int tiles_q8(const float *x, int64_t rows, const int8_t *tq, const uint16_t *ts, int64_t n,
             int64_t k, float *work, float *out, int nthreads)
{
    KhQ8Tiles w = {tq, ts, n, k};
    KhTileKernel kernel = q8_tiles_c;
    int mr_max = 4, level = tiles_simd(), x_form = KH_X_Q8, interleaved = 0;
    if (rows <= 0 || n <= 0 || n % KH_TILE || nthreads <= 0) return KH_EINVAL;
    if (tiles_q8_work_floats(rows, k) < 0) return KH_EINVAL;
    if (!x || !tq || !ts || !work || !out) return KH_EINVAL;
#if KH_HAVE_X86_SIMD
    switch (level) {
    case 3:
        kernel = rows <= KH_TILES_MR512 ? kh_q8_tiles_vnni512_decode : kh_q8_tiles_vnni512;
        mr_max = rows <= KH_TILES_MR512 ? (int)rows : 4;
        x_form = KH_X_Q8_SUMS; /* vpdpbusd's -128 * sum(x) */
        interleaved = 1;
        break;
    case 1: kernel = kh_q8_tiles_avx2; break;
    default: break;
    }
#endif
#if KH_HAVE_AMX
    if (kh_amx_call(rows, KH_Q8_AMX_MIN_ROWS, level)) {
        kernel = kh_q8_tiles_amx;
        mr_max = KH_AMX_ROWS;
        x_form = KH_X_Q8, interleaved = 0;
    }
#endif
    kh_tiles_run(&w, kernel, mr_max, n, k, k, x_form, interleaved, x, rows, work, out,
                 nthreads);
    return KH_OK;
}
