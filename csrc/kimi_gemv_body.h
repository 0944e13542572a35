/* kimi_gemv_body.h: the float GEMV row kernels (INT4 blocks for group % 32 == 0, fp16 and
 * bf16 rows), written once and compiled per vector width by the file that includes it:
 * kimi_gemv_avx2.c (8 lanes), kimi_gemv_avx512.c (16). Not a header of its own: the includer
 * defines
 *   KH_G_FN(name)     this width's name of an exported function (name ## _avx2, ...);
 *   KH_G_TARGET       the function attribute;
 *   KH_G_VEC, KH_G_LANES            the float vector and its lanes;
 *   KH_G_ZERO(), KH_G_LOAD(p), KH_G_STORE(p, v), KH_G_ADD(a, b), KH_G_MUL(a, b),
 *                     KH_G_FMA(a, b, c) (a * b + c), KH_G_SUM(v) (the sum of the lanes);
 *   KH_G_PASS_ROWS    x rows that meet a decoded block (1..4; more take further passes);
 *   KH_G_CHAINS       (optional, 4 by default) FMA accumulators per x row;
 *   KH_G_SCALE_AFTER  (optional) scale each block's dot, not its codes; then
 *   KH_G_DECODE_RAW(p, mask, c)     the codes at p as floats (no scale) for KH_G_BLOCK;
 *   KH_G_HALVES(p)    KH_G_LANES fp16 values at p as floats;
 *   KH_G_SCALES(f)    what a block's decode needs of its scale f (a broadcast, or a table);
 *   KH_G_DECODE(p, mask, sc, c)     (without KH_G_SCALE_AFTER) the 16 code bytes at p ->
 *                     c[0 .. 32/KH_G_LANES - 1]: the
 *                     low nibbles (the block's even elements), then the high ones, each the
 *                     float fl(code * f) (sc = KH_G_SCALES(f)), whatever the width;
 *   KH_G_BF16         (AVX2 only) KH_G_BF16(p): KH_G_LANES bfloat16 values at p as floats.
 * x comes de-interleaved per block of 32 (kh_prepare_x), so c[v] meets x lanes v * KH_G_LANES
 * on. Memory traffic: 16 code bytes + 4 bytes of scale/min per 32 weights, read once for all
 * rows of x; x stays in L1/L2. */

#define KH_G_PER_BLOCK (32 / KH_G_LANES)  /* vectors per block of 32 elements */
#define KH_G_PER_16 (16 / KH_G_LANES)     /* vectors per 16 elements of a 16-bit row */

/* sum_g h[g] * v[g] for fp16 h: the m*sum(x_g) half of the dot product (given the scales, -8
 * times it is a symmetric row's half). Static, so the row kernels inline it (an exported
 * function is not inlined under -fPIC: a call per weight row cost the AVX-512 kernel 10%). */
static KH_G_TARGET inline float halves_dot(const uint16_t *h, const float *v, int64_t n)
{
    KH_G_VEC acc = KH_G_ZERO();
    float tail = 0.0f;
    int64_t g = 0;
    for (; g + KH_G_LANES <= n; g += KH_G_LANES)
        acc = KH_G_FMA(KH_G_HALVES(h + g), KH_G_LOAD(v + g), acc);
    for (; g < n; g++) tail += _cvtsh_ss(h[g]) * v[g];
    return KH_G_SUM(acc) + tail;
}

KH_G_TARGET float KH_G_FN(kh_halves_dot)(const uint16_t *h, const float *v, int64_t n)
{
    return halves_dot(h, v, n);
}

/* n fp16 scales -> fp32 (n <= KH_SCALE_CHUNK), KH_G_LANES at a time. */
static KH_G_TARGET void halves_to_floats(const uint16_t *h, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + KH_G_LANES <= n; i += KH_G_LANES) KH_G_STORE(out + i, KH_G_HALVES(h + i));
    for (; i < n; i++) out[i] = _cvtsh_ss(h[i]);
}

/* KH_G_CHAINS FMA chains per x row (the includer may set it; 4 by default): one row's block
 * is KH_G_PER_BLOCK dependent FMAs into one accumulator otherwise, and the FMA's latency
 * (4-5 cycles), not the memory, bounded a one-row GEMV (hot: 35 GB/s at 2 threads, AVX-512).
 * Chain (PARITY * KH_G_PER_BLOCK + v) % KH_G_CHAINS takes vector v of the blocks of one
 * parity: at AVX-512's 2 vectors a block and 4 chains, even and odd blocks apart. The
 * includer's KH_G_PASS_ROWS (1..4) x rows meet a decoded block; more rows take further passes
 * over the weight row, which L1 then holds. */
#ifndef KH_G_CHAINS
#define KH_G_CHAINS 4
#endif
#if KH_G_PASS_ROWS < 1 || KH_G_PASS_ROWS > 4
#error "KH_G_PASS_ROWS must be 1..4: the row kernels below are row_1 .. row_4"
#endif
#define KH_G_CHAIN(PARITY, v) (((PARITY) * KH_G_PER_BLOCK + (v)) % KH_G_CHAINS)

/* acc[r][chain] += (sc * codes) . x_r block for every row r: the codes are decoded and
 * scaled once, then KH_G_PER_BLOCK FMAs per row. A row runs the same operations in any pass
 * (no dot-then-scale shortcut), so its result does not depend on the rows batched with it. */
#ifdef KH_G_SCALE_AFTER
/* The includer's choice (AVX2): a block's raw codes (KH_G_DECODE_RAW, no scale) meet each row
 * in a block dot t, then acc[r][parity] += t * scale. At 8 lanes scaling the codes cost 4
 * multiplies a block, a quarter of its decode; this costs one FMA a row a block instead, and
 * measured faster at every row count (1 thread, 4096 x 2304, rows 1/2/4/8: 537/583/840/1870
 * -> 397/527/828/1870 us; the MoE layer at one token 1.77 -> 1.31 ms, AVX2 on a Zen 4 EPYC). */
#define KH_G_BLOCK(ROWS, BLK, SC, PARITY)                                                  \
    do {                                                                                   \
        KH_G_VEC c[KH_G_PER_BLOCK], t_;                                                    \
        int v;                                                                             \
        KH_G_DECODE_RAW(w->q + (BLK) * 16, mask, c);                                       \
        for (r = 0; r < ROWS; r++) {                                                       \
            const float *xe = xperm + r * w->k + (BLK) * 32;                               \
            t_ = KH_G_MUL(c[0], KH_G_LOAD(xe));                                            \
            for (v = 1; v < KH_G_PER_BLOCK; v++)                                           \
                t_ = KH_G_FMA(c[v], KH_G_LOAD(xe + v * KH_G_LANES), t_);                   \
            acc[r][(PARITY) % KH_G_CHAINS] = KH_G_FMA(t_, SC, acc[r][(PARITY) % KH_G_CHAINS]); \
        }                                                                                  \
    } while (0)
#else
#define KH_G_BLOCK(ROWS, BLK, SC, PARITY)                                                  \
    do {                                                                                   \
        KH_G_VEC c[KH_G_PER_BLOCK];                                                        \
        int v;                                                                             \
        KH_G_DECODE(w->q + (BLK) * 16, mask, SC, c);                                       \
        for (r = 0; r < ROWS; r++) {                                                       \
            const float *xe = xperm + r * w->k + (BLK) * 32;                               \
            for (v = 0; v < KH_G_PER_BLOCK; v++)                                           \
                acc[r][KH_G_CHAIN(PARITY, v)] = KH_G_FMA(                                  \
                    c[v], KH_G_LOAD(xe + v * KH_G_LANES), acc[r][KH_G_CHAIN(PARITY, v)]);  \
        }                                                                                  \
    } while (0)
#endif

/* ROWS (1..4) is a constant in each instance, so the accumulators live in registers. A group
 * of one block takes its scales KH_SCALE_CHUNK at a time, converted at once. */
#define KH_G_ROW_KERNEL(ROWS)                                                              \
    static KH_G_TARGET void row_##ROWS(const KhRow *w, const float *xperm, const float *xsum, \
                                       float *y, int64_t y_stride)                         \
    {                                                                                      \
        const __m128i mask = _mm_set1_epi8(0x0f);                                          \
        int64_t groups = w->k / w->group, blocks = w->group / 32, g, b;                    \
        KH_G_VEC acc[ROWS][KH_G_CHAINS];                                                   \
        int r, i;                                                                          \
        (void)mask;                                                                        \
        for (r = 0; r < ROWS; r++)                                                         \
            for (i = 0; i < KH_G_CHAINS; i++) acc[r][i] = KH_G_ZERO();                     \
        if (blocks == 1) {                                                                 \
            int64_t g0;                                                                    \
            for (g0 = 0; g0 < groups; g0 += KH_SCALE_CHUNK) {                              \
                int64_t gend = g0 + KH_SCALE_CHUNK;                                        \
                float scf[KH_SCALE_CHUNK];                                                 \
                if (gend > groups) gend = groups;                                          \
                halves_to_floats(w->scales + g0, gend - g0, scf);                          \
                for (g = g0; g + 1 < gend; g += 2) {                                       \
                    KH_G_VEC sc0 = KH_G_SCALES(scf[g - g0]), sc1 = KH_G_SCALES(scf[g + 1 - g0]); \
                    _mm_prefetch((const char *)(w->q + g * 16 + KH_PREFETCH), _MM_HINT_T0); \
                    KH_G_BLOCK(ROWS, g, sc0, 0);                                           \
                    KH_G_BLOCK(ROWS, g + 1, sc1, 1);                                       \
                }                                                                          \
                if (g < gend) KH_G_BLOCK(ROWS, g, KH_G_SCALES(scf[g - g0]), 0);            \
            }                                                                              \
        } else {                                                                           \
            for (g = 0; g < groups; g++) {                                                 \
                KH_G_VEC sc0 = KH_G_SCALES(_cvtsh_ss(w->scales[g]));                       \
                for (b = 0; b + 1 < blocks; b += 2) {                                      \
                    KH_G_BLOCK(ROWS, g * blocks + b, sc0, 0);                              \
                    KH_G_BLOCK(ROWS, g * blocks + b + 1, sc0, 1);                          \
                }                                                                          \
                if (b < blocks) KH_G_BLOCK(ROWS, g * blocks + b, sc0, 0);                  \
            }                                                                              \
        }                                                                                  \
        for (r = 0; r < ROWS; r++) {                                                       \
            const float *xs = xsum + r * groups; /* symmetric: min = -8 s */               \
            float mins_term = w->mins ? halves_dot(w->mins, xs, groups)                    \
                                      : KH_SYMMETRIC_MIN(halves_dot(w->scales, xs, groups)); \
            KH_G_VEC sum = acc[r][0];                                                      \
            for (i = 1; i < KH_G_CHAINS; i++) sum = KH_G_ADD(sum, acc[r][i]);              \
            y[r * y_stride] = KH_G_SUM(sum) + mins_term;                                   \
        }                                                                                  \
    }

KH_G_ROW_KERNEL(1)
KH_G_ROW_KERNEL(2)
KH_G_ROW_KERNEL(3)
KH_G_ROW_KERNEL(4)

typedef void (*RowKernel)(const KhRow *, const float *, const float *, float *, int64_t);
static const RowKernel by_rows[5] = {0, row_1, row_2, row_3, row_4};

void KH_G_FN(kh_row_blocks)(const KhRow *w, const float *xperm, const float *xsum,
                            int64_t rows, float *y, int64_t y_stride)
{
    int64_t r0, groups = w->k / w->group;
    for (r0 = 0; r0 < rows; r0 += KH_G_PASS_ROWS) {
        int64_t n = rows - r0 < KH_G_PASS_ROWS ? rows - r0 : KH_G_PASS_ROWS;
        by_rows[n](w, xperm + r0 * w->k, xsum + r0 * groups, y + r0 * y_stride, y_stride);
    }
}

/* Two 16-bit weight rows against every x row, 16 elements a step, one FMA chain per
 * KH_G_LANES of them per weight row (FMA latency); each (row, weight row) pair runs the same
 * operations whatever `rows` is. Memory traffic: 2 bytes per weight, read once per call (the
 * two rows stay in L1 across the x rows). The LM head: fp16 converts KH_G_LANES halves in one
 * instruction where the portable loop converts them one by one. */
#define KH_G_H16_ROWS(NAME, CVT, CVT1)                                                     \
    KH_G_TARGET void NAME(const uint16_t *w0, const uint16_t *w1, int64_t k, const float *x, \
                          int64_t rows, float *y0, float *y1, int64_t y_stride)            \
    {                                                                                      \
        int64_t r, j, main = k - k % 16;                                                   \
        int v;                                                                             \
        for (r = 0; r < rows; r++) {                                                       \
            const float *xr = x + r * k;                                                   \
            KH_G_VEC a0[KH_G_PER_16], a1[KH_G_PER_16], s0, s1;                             \
            float t0, t1;                                                                  \
            for (v = 0; v < KH_G_PER_16; v++) a0[v] = a1[v] = KH_G_ZERO();                 \
            for (j = 0; j < main; j += 16)                                                 \
                for (v = 0; v < KH_G_PER_16; v++) {                                        \
                    KH_G_VEC xv = KH_G_LOAD(xr + j + v * KH_G_LANES);                      \
                    a0[v] = KH_G_FMA(CVT(w0 + j + v * KH_G_LANES), xv, a0[v]);             \
                    a1[v] = KH_G_FMA(CVT(w1 + j + v * KH_G_LANES), xv, a1[v]);             \
                }                                                                          \
            s0 = a0[0], s1 = a1[0];                                                        \
            for (v = 1; v < KH_G_PER_16; v++) s0 = KH_G_ADD(s0, a0[v]), s1 = KH_G_ADD(s1, a1[v]); \
            t0 = KH_G_SUM(s0);                                                             \
            t1 = KH_G_SUM(s1);                                                             \
            for (; j < k; j++) {                                                           \
                t0 += CVT1(w0[j]) * xr[j];                                                 \
                t1 += CVT1(w1[j]) * xr[j];                                                 \
            }                                                                              \
            y0[r * y_stride] = t0;                                                         \
            y1[r * y_stride] = t1;                                                         \
        }                                                                                  \
    }

KH_G_H16_ROWS(KH_G_FN(kh_f16_rows), KH_G_HALVES, _cvtsh_ss)
#ifdef KH_G_BF16
/* bfloat16 weights (Kimi-Linear's kept projections and LM head on the CPU): the same loop. */
KH_G_H16_ROWS(KH_G_FN(kh_bf16_rows), KH_G_BF16, kh_bf16_to_float)
#endif

#undef KH_G_PER_BLOCK
#undef KH_G_PER_16
#undef KH_G_BLOCK
#undef KH_G_CHAINS
#undef KH_G_SCALE_AFTER
#undef KH_G_CHAIN
#undef KH_G_ROW_KERNEL
#undef KH_G_H16_ROWS
