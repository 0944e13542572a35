/* kimi_int8_body.h: the integer-dot row kernels (W4A8 at decode, the Q8_0 head), written once
 * and compiled per instruction set by the file that includes it: kimi_w4a8_avx2.c (AVX2),
 * kimi_w4a8_vnni.c (AVX-VNNI, AVX-512 VNNI). Not a header of its own: the includer defines
 *   KH_I8_FN(name)          this set's name of a function (name ## _avx2, ...);
 *   KH_I8_TARGET            the function attribute;
 *   KH_I8_DOT4(lo, hi, even, odd)  8 int32 lanes, lane l = sum over bytes 4l..4l+3 of
 *                           lo * even + hi * odd (unsigned codes times signed x codes);
 *   KH_I8_SDOT(w, x)        8 int32 lanes, lane l = sum over bytes 4l..4l+3 of w * x (signed);
 *   KH_I8_WIDE              1: two pairs of blocks per step as 512-bit integer work.
 * No step of any set saturates (at most 4 * 15 * 127 per W4A8 lane, 4 * 128 * 127 per Q8_0
 * lane; AVX2's int16 stages at most 2 * 2 * 15 * 127 and 2 * 128 * 127), so every set gets
 * the same int32 dots, and the float work that follows is this one text: the sets' results
 * are the same bits. Only the integer instructions differ. */

/* The scale s_g of each of the `count` (<= 8) blocks from b0 on, as floats. */
static KH_I8_TARGET void KH_I8_FN(block_scales)(const KhRow *w, int64_t b0, int count, float *out)
{
    int64_t per_group = w->group / 32;
    int j;
    if (per_group == 1 && count == 8) {
        _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->scales + b0))));
        return;
    }
    for (j = 0; j < count; j++) out[j] = _cvtsh_ss(w->scales[(b0 + j) / per_group]);
}

#ifndef KH_I8_LANES_DEFINED
#define KH_I8_LANES_DEFINED
/* kh_i8_lanes + 8 - n: a mask of the first n 32-bit lanes (maskload reads no others). */
static const int32_t kh_i8_lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#endif

/* The first count (even, <= 8) halves from h on as floats, the rest 0; no byte past them is
 * read (a row's last blocks end its scales). */
static KH_I8_TARGET inline __m256 KH_I8_FN(halves_upto)(const uint16_t *h, int count)
{
    __m128i mask = _mm_loadu_si128((const __m128i *)(kh_i8_lanes + 8 - count / 2));
    return _mm256_cvtph_ps(_mm_maskload_epi32((const int *)h, mask));
}

#ifndef KH_I8_PAIRS_DEFINED
#define KH_I8_PAIRS_DEFINED
/* Block pair p of the 8 from b0 (block 2p in lanes 0-3, 2p+1 in 4-7): which of the 8 scales
 * each lane takes. A table: building the vector in the loop cost 5 instructions a pair. */
static const int32_t kh_i8_pair_lanes[4][8] = {
    {0, 0, 0, 0, 1, 1, 1, 1}, {2, 2, 2, 2, 3, 3, 3, 3},
    {4, 4, 4, 4, 5, 5, 5, 5}, {6, 6, 6, 6, 7, 7, 7, 7}};
#endif
#define KH_I8_PAIR_LANES(p) _mm256_loadu_si256((const __m256i *)kh_i8_pair_lanes[p])

#if KH_I8_WIDE
/* Pairs p and p+1 of x in the pair layout as 512 bits: [E_j E_j+1 | E_j+2 E_j+3] (even) and
 * the odd elements alike; the codes of blocks j..j+3 are 64 contiguous bytes already. */
#define KH_I8_X512(xp, half) _mm512_inserti64x4(                                            \
    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)((xp) + (half)))),           \
    _mm256_loadu_si256((const __m256i *)((xp) + 64 + (half))), 1)
/* The high 8 floats of a 512-bit vector (AVX-512F only: no DQ needed). */
#define KH_I8_HIGH8(f) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))
/* acc += pairs p and p+1 at once: the 512-bit dots of codes (lo, hi) with x (even, odd), pair
 * p in the low 8 lanes and p+1 in the high ones, each times its lanes of sd: two FMAs. */
#define KH_I8_WIDE_FMA(acc, sd, p, lo, hi, even, odd)                                       \
    do {                                                                                    \
        __m512 dots = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(                               \
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, even), hi, odd));               \
        acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sd, KH_I8_PAIR_LANES(p)),            \
                              _mm512_castps512_ps256(dots), acc);                           \
        acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sd, KH_I8_PAIR_LANES((p) + 1)),      \
                              KH_I8_HIGH8(dots), acc);                                      \
    } while (0)
#endif
/* acc += pair p's int32 dots (block 2p in lanes 0-3, 2p+1 in 4-7) times its lanes of sd. */
#define KH_I8_PAIR_FMA(acc, sd, p, dot) acc = _mm256_fmadd_ps(                              \
    _mm256_permutevar8x32_ps(sd, KH_I8_PAIR_LANES(p)), _mm256_cvtepi32_ps(dot), acc)
/* The low and high nibbles of the code bytes raw (256 or 512 bits: BITS). */
#define KH_I8_NIBBLES(BITS, raw, mask, lo, hi)                                              \
    __m##BITS##i lo = _mm##BITS##_and_si##BITS(raw, mask);                                  \
    __m##BITS##i hi = _mm##BITS##_and_si##BITS(_mm##BITS##_srli_epi16(raw, 4), mask)

/* One x row against 4 weight rows at once (decode at B = 1), two blocks per step: 32 code
 * bytes (blocks j, j+1) give the even elements of both by one mask and the odd ones by one
 * shift, and x comes in the matching pair layout (kh_pair_q8: [E_j E_j+1 | O_j O_j+1]).
 * KH_I8_DOT4 gives block j in lanes 0-3 and j+1 in 4-7, and one FMA scales them by
 * [s_j d_j x4 | s_j+1 d_j+1 x4]. Each x pair is loaded once for the 4 rows, whose
 * accumulators are independent FMA chains. k % 64 == 0; rows of one linear share k and
 * group, and mins are NULL for all or none. */
KH_I8_TARGET void KH_I8_FN(kh_q8_rows4)(const KhRow *w, const KhQ8 *x, float *y)
{
    const __m256i mask = _mm256_set1_epi8(0x0f);
    int64_t k = w[0].k, groups = k / w[0].group, nb = k / 32, b0;
    int block_groups = w[0].group == 32; /* a scale and min per block: the mins join the loop */
    /* Prefetch two quads ahead: the 4 rows are consecutive in every caller, so 4k bytes on is
     * the same block 8 rows later. With long rows (Kimi's k = 2304: 1,152 bytes) the fixed
     * KH_PREFETCH fell inside the quad being read: a top-8 Kimi MoE layer went 2.37 -> 1.97
     * ms, SmolLM2's down projection (k = 1536) 74.6 -> 67.6 us (AMD EPYC Zen 2, 2 threads). */
    const int64_t ahead = 4 * k > KH_PREFETCH ? 4 * k : KH_PREFETCH;
    __m256 acc[4], acc_min[4];
    __m128 sums;
    float tail_min[4] = {0};
    int i, p, j;
    for (i = 0; i < 4; i++) acc[i] = acc_min[i] = _mm256_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8; /* even: nb is */
        __m256 sd[4];
        for (i = 0; i < 4; i++) {
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + 64 + ahead), _MM_HINT_T0);
            if (block_groups && count == 8) {
                __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w[i].scales + b0)));
                __m256 m = w[i].mins
                    ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w[i].mins + b0)))
                    : _mm256_mul_ps(s, _mm256_set1_ps(-8.0f)); /* symmetric */
                sd[i] = _mm256_mul_ps(s, _mm256_loadu_ps(x->d + b0));
                acc_min[i] = _mm256_fmadd_ps(m, _mm256_loadu_ps(x->gsum + b0), acc_min[i]);
            } else if (block_groups) { /* the row's last blocks: lanes past count are 0 */
                __m256i lanes = _mm256_loadu_si256((const __m256i *)(kh_i8_lanes + 8 - count));
                __m256 s = KH_I8_FN(halves_upto)(w[i].scales + b0, count);
                __m256 m = w[i].mins ? KH_I8_FN(halves_upto)(w[i].mins + b0, count)
                                     : _mm256_mul_ps(s, _mm256_set1_ps(-8.0f));
                sd[i] = _mm256_mul_ps(s, _mm256_maskload_ps(x->d + b0, lanes));
                tail_min[i] += hsum256(_mm256_mul_ps(m, _mm256_maskload_ps(x->gsum + b0, lanes)));
            } else {
                float sblk[8] = {0}, prod[8] = {0};
                KH_I8_FN(block_scales)(&w[i], b0, count, sblk);
                for (j = 0; j < count; j++) prod[j] = sblk[j] * x->d[b0 + j];
                sd[i] = _mm256_loadu_ps(prod);
            }
        }
        for (p = 0; p < count / 2; p++) {
            const int8_t *xp = x->q + (b0 + 2 * p) * 32;
#if KH_I8_WIDE
            if (p + 1 < count / 2) { /* pairs p and p+1 in 512 bits, then AVX2's two FMAs */
                const __m512i mask512 = _mm512_set1_epi8(0x0f);
                __m512i even = KH_I8_X512(xp, 0), odd = KH_I8_X512(xp, 32);
                for (i = 0; i < 4; i++) {
                    __m512i raw = _mm512_loadu_si512((const void *)(w[i].q + (b0 + 2 * p) * 16));
                    KH_I8_NIBBLES(512, raw, mask512, lo, hi);
                    KH_I8_WIDE_FMA(acc[i], sd[i], p, lo, hi, even, odd);
                }
                p++;
                continue;
            }
#endif
            {
                __m256i even = _mm256_loadu_si256((const __m256i *)xp);
                __m256i odd = _mm256_loadu_si256((const __m256i *)(xp + 32));
                for (i = 0; i < 4; i++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(w[i].q + (b0 + 2 * p) * 16));
                    KH_I8_NIBBLES(256, raw, mask, lo, hi);
                    KH_I8_PAIR_FMA(acc[i], sd[i], p, KH_I8_DOT4(lo, hi, even, odd));
                }
            }
        }
    }
    { /* the 4 rows' lane sums at once: [A B C D] */
        __m256 ab = _mm256_hadd_ps(_mm256_add_ps(acc[0], acc_min[0]), _mm256_add_ps(acc[1], acc_min[1]));
        __m256 cd = _mm256_hadd_ps(_mm256_add_ps(acc[2], acc_min[2]), _mm256_add_ps(acc[3], acc_min[3]));
        __m256 all = _mm256_hadd_ps(ab, cd);
        sums = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
    }
    _mm_storeu_ps(y, _mm_add_ps(sums, _mm_loadu_ps(tail_min)));
    if (block_groups) return;
    for (i = 0; i < 4; i++) /* groups of several blocks: the min terms per group */
        y[i] += w[i].mins ? kh_halves_dot_avx2(w[i].mins, x->gsum, groups)
                          : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w[i].scales, x->gsum, groups));
}

/* One weight row against `rows` (1..KH_MAX_ROWS) x rows in the pair layout, each (weight row,
 * x row) by exactly the operations of kh_q8_rows4 (the same lanes, FMA order, tail and
 * reduction), so a decode row's result is the same bits alone or in a batch. Inlined into one
 * kernel per row count up to 6 (below): with `rows` a variable the accumulators live on the
 * stack and each FMA chain goes through a store and a load. SmolLM2-135M's 210 W4A8 GEMVs,
 * AVX-512 VNNI EPYC, 2 threads, rows 1..6: 4.1 7.3 8.8 9.5 11.2 11.9 ms -> 4.2 5.7 7.1 8.2
 * 10.4 11.5 ms (the verify step of a k-token draft runs k + 1 rows). */
static KH_I8_TARGET inline __attribute__((always_inline)) void KH_I8_FN(pairs_body)(
    const KhRow *w, const KhQ8 *x, int64_t rows, float *y, int64_t y_stride)
{
    const __m256i mask = _mm256_set1_epi8(0x0f);
    int64_t k = w->k, groups = k / w->group, nb = k / 32, b0, r;
    int block_groups = w->group == 32;
    __m256 acc[KH_MAX_ROWS], acc_min[KH_MAX_ROWS], sd[KH_MAX_ROWS];
    float tail_min[KH_MAX_ROWS] = {0};
    int p, j;
    for (r = 0; r < rows; r++) acc[r] = acc_min[r] = _mm256_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8;
        _mm_prefetch((const char *)(w->q + b0 * 16 + KH_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(w->q + b0 * 16 + 64 + KH_PREFETCH), _MM_HINT_T0);
        if (block_groups && count == 8) {
            __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->scales + b0)));
            __m256 m = w->mins ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->mins + b0)))
                               : _mm256_mul_ps(sv, _mm256_set1_ps(-8.0f));
            for (r = 0; r < rows; r++) {
                sd[r] = _mm256_mul_ps(sv, _mm256_loadu_ps(x->d + r * nb + b0));
                acc_min[r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(x->gsum + r * groups + b0),
                                             acc_min[r]);
            }
        } else if (block_groups) { /* the row's last blocks, as kh_q8_rows4 takes them */
            __m256i lanes = _mm256_loadu_si256((const __m256i *)(kh_i8_lanes + 8 - count));
            __m256 sv = KH_I8_FN(halves_upto)(w->scales + b0, count);
            __m256 m = w->mins ? KH_I8_FN(halves_upto)(w->mins + b0, count)
                               : _mm256_mul_ps(sv, _mm256_set1_ps(-8.0f));
            for (r = 0; r < rows; r++) {
                sd[r] = _mm256_mul_ps(sv, _mm256_maskload_ps(x->d + r * nb + b0, lanes));
                tail_min[r] += hsum256(_mm256_mul_ps(
                    m, _mm256_maskload_ps(x->gsum + r * groups + b0, lanes)));
            }
        } else {
            float sblk[8] = {0};
            KH_I8_FN(block_scales)(w, b0, count, sblk);
            for (r = 0; r < rows; r++) {
                float prod[8] = {0};
                for (j = 0; j < count; j++) prod[j] = sblk[j] * x->d[r * nb + b0 + j];
                sd[r] = _mm256_loadu_ps(prod);
            }
        }
        for (p = 0; p < count / 2; p++) {
#if KH_I8_WIDE
            if (p + 1 < count / 2) { /* pairs p and p+1 in 512 bits, then AVX2's two FMAs */
                const __m512i mask512 = _mm512_set1_epi8(0x0f);
                __m512i raw = _mm512_loadu_si512((const void *)(w->q + (b0 + 2 * p) * 16));
                KH_I8_NIBBLES(512, raw, mask512, lo, hi);
                for (r = 0; r < rows; r++) {
                    const int8_t *xp = x->q + r * k + (b0 + 2 * p) * 32;
                    KH_I8_WIDE_FMA(acc[r], sd[r], p, lo, hi, KH_I8_X512(xp, 0), KH_I8_X512(xp, 32));
                }
                p++;
                continue;
            }
#endif
            {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(w->q + (b0 + 2 * p) * 16));
                KH_I8_NIBBLES(256, raw, mask, lo, hi);
                for (r = 0; r < rows; r++) {
                    const int8_t *xp = x->q + r * k + (b0 + 2 * p) * 32;
                    KH_I8_PAIR_FMA(acc[r], sd[r], p,
                                   KH_I8_DOT4(lo, hi, _mm256_loadu_si256((const __m256i *)xp),
                                              _mm256_loadu_si256((const __m256i *)(xp + 32))));
                }
            }
        }
    }
    for (r = 0; r < rows; r++) { /* kh_q8_rows4's hadd tree, for one row */
        __m256 a = _mm256_add_ps(acc[r], acc_min[r]);
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, a), _mm256_hadd_ps(a, a));
        float sum = _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
        float out = sum + tail_min[r];
        if (!block_groups)
            out += w->mins ? kh_halves_dot_avx2(w->mins, x->gsum + r * groups, groups)
                           : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w->scales, x->gsum + r * groups, groups));
        y[r * y_stride] = out;
    }
}

#define KH_I8_PAIRS_ROWS(ROWS)                                                              \
    static KH_I8_TARGET void KH_I8_FN(pairs_rows##ROWS)(const KhRow *w, const KhQ8 *x,       \
                                                      float *y, int64_t y_stride)          \
    {                                                                                      \
        KH_I8_FN(pairs_body)(w, x, ROWS, y, y_stride);                                     \
    }
KH_I8_PAIRS_ROWS(1) KH_I8_PAIRS_ROWS(2) KH_I8_PAIRS_ROWS(3) KH_I8_PAIRS_ROWS(4)
KH_I8_PAIRS_ROWS(5) KH_I8_PAIRS_ROWS(6)
#undef KH_I8_PAIRS_ROWS

KH_I8_TARGET void KH_I8_FN(kh_q8_pairs)(const KhRow *w, const KhQ8 *x, int64_t rows, float *y,
                                        int64_t y_stride)
{
    static void (*const by_rows[7])(const KhRow *, const KhQ8 *, float *, int64_t) = {
        0, KH_I8_FN(pairs_rows1), KH_I8_FN(pairs_rows2), KH_I8_FN(pairs_rows3),
        KH_I8_FN(pairs_rows4), KH_I8_FN(pairs_rows5), KH_I8_FN(pairs_rows6)};
    if (rows <= 6)
        by_rows[rows](w, x, y, y_stride);
    else /* 7 and 8 rows unrolled spill (24 accumulators): 14.7/15.9 ms against 14.1/14.7 */
        KH_I8_FN(pairs_body)(w, x, rows, y, y_stride);
}

/* Q8_0 weights against x quantized in natural order (kimi_q8.c): per block of 32, |w|
 * (unsigned; |-128| reads as 128) meets x with w's sign moved onto it (sign_epi8), which
 * gives the same products, and one FMA adds the 8 lane sums times s_b * d_b, even and odd
 * blocks into two accumulators: with one, the FMA chain (4 cycles a block) held the head to
 * 1.28-1.43 ms on the AVX-512 VNNI EPYC, 1.13-1.21 ms with two (49152 x 576, 2 threads).
 * Blocks go 8 at a time, so the 8 scale products of a row are one vector multiply. Memory
 * traffic: 34 bytes per 32 weights. */
KH_I8_TARGET void KH_I8_FN(kh_q8q8_row)(const int8_t *w, const uint16_t *s, int64_t k,
                                        const KhQ8 *x, int64_t rows, float *y, int64_t y_stride)
{
    int64_t nb = k / KH_Q8_BLOCK, b0, r;
    __m256 acc[KH_MAX_ROWS], acc_odd[KH_MAX_ROWS]; /* even and odd blocks: two FMA chains */
    float sblk[8], sd[8];
    for (r = 0; r < rows; r++) acc[r] = acc_odd[r] = _mm256_setzero_ps();
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8, j;
        _mm_prefetch((const char *)(w + b0 * 32 + KH_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + b0 * 32 + 64 + KH_PREFETCH), _MM_HINT_T0);
        if (count == 8)
            _mm256_storeu_ps(sblk, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + b0))));
        else
            for (j = 0; j < count; j++) sblk[j] = _cvtsh_ss(s[b0 + j]);
        for (r = 0; r < rows; r++) {
            const int8_t *xr = x->q + r * k;
            const float *d = x->d + r * nb + b0;
            if (count == 8)
                _mm256_storeu_ps(sd, _mm256_mul_ps(_mm256_loadu_ps(sblk), _mm256_loadu_ps(d)));
            else
                for (j = 0; j < count; j++) sd[j] = sblk[j] * d[j];
            for (j = 0; j < count; j++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (b0 + j) * 32));
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xr + (b0 + j) * 32));
                __m256i dot = KH_I8_SDOT(wv, xv);
                __m256 *into = j % 2 ? &acc_odd[r] : &acc[r];
                *into = _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[j]), _mm256_cvtepi32_ps(dot), *into);
            }
        }
    }
    for (r = 0; r < rows; r++) y[r * y_stride] = hsum256(_mm256_add_ps(acc[r], acc_odd[r]));
}

#undef KH_I8_PAIR_LANES
#undef KH_I8_X512
#undef KH_I8_HIGH8
#undef KH_I8_WIDE_FMA
#undef KH_I8_PAIR_FMA
#undef KH_I8_NIBBLES
