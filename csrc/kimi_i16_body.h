/* kimi_i16_body.h: the W4A16 integer-dot kernels on x rounded to int16 (kimi_moe_i16.c says
 * what they compute) in the pair layout, compiled by kimi_i16_simd.c for AVX-512 VNNI (and for
 * tests/vnni_emulated.sh's stand-ins). AVX2's set is kimi_i16_avx2.c.
 * Not a header of its own: the includer defines
 *   I16_FN(name)            this set's name of a function;
 *   I16_TARGET              the function attribute;
 *   I16_ACC                 a row's accumulator type, I16_ZERO its zero;
 *   I16_PAIR(acc, sd, p, q, xq)  acc += pair p of the 8 blocks whose products s_b d_b are
 *                           sd (__m256): the 32 code bytes at q against the x codes at xq
 *                           (the pair layout: 32 even, then 32 odd int16);
 *   I16_SUM(acc)            the accumulator's lanes summed, in a fixed order.
 * The 4-row kernel (one x row, a decode token) and the n-row one (a segment of several routes)
 * run the same operations per (weight row, x row): a token's bits do not depend on the batch. */

/* s_b d_b for the `count` (even, <= 8) blocks from b0 on, the rest 0. */
static I16_TARGET inline __m256 I16_FN(block_sd)(const KhRow *w, const float *d, int64_t b0,
                                                 int count)
{
    float prod[8] = {0};
    int64_t per_group = w->group / 32;
    int j;
    if (per_group == 1 && count == 8)
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->scales + b0))),
                             _mm256_loadu_ps(d + b0));
    for (j = 0; j < count; j++) prod[j] = _cvtsh_ss(w->scales[(b0 + j) / per_group]) * d[b0 + j];
    return _mm256_loadu_ps(prod);
}

/* The lane sum plus the min terms (AVX2's halves dot: present wherever these run). */
static I16_TARGET inline float I16_FN(finish)(I16_ACC acc, const KhRow *w, const float *gsum)
{
    int64_t groups = w->k / w->group;
    float mins = w->mins ? kh_halves_dot_avx2(w->mins, gsum, groups)
                         : KH_SYMMETRIC_MIN(kh_halves_dot_avx2(w->scales, gsum, groups));
    return I16_SUM(acc) + mins;
}

/* One x row against 4 weight rows: each x pair read once for the 4. */
I16_TARGET void I16_FN(kh_i16_rows4)(const KhRow *w, const KhI16 *x, float *y)
{
    int64_t k = w[0].k, nb = k / 32, b0;
    /* two quads ahead: the 4 rows are consecutive, so 4k bytes on is 8 rows later (as
     * kh_q8_rows4 found for Kimi's long rows) */
    const int64_t ahead = 4 * k > KH_PREFETCH ? 4 * k : KH_PREFETCH;
    I16_ACC acc[4];
    int i, p;
    for (i = 0; i < 4; i++) acc[i] = I16_ZERO;
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8;
        __m256 sd[4];
        for (i = 0; i < 4; i++) {
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(w[i].q + b0 * 16 + 64 + ahead), _MM_HINT_T0);
            sd[i] = I16_FN(block_sd)(&w[i], x->d, b0, count);
        }
        for (p = 0; p < count / 2; p++)
            for (i = 0; i < 4; i++)
                I16_PAIR(acc[i], sd[i], p, w[i].q + (b0 + 2 * p) * 16, x->q + (b0 + 2 * p) * 32);
    }
    for (i = 0; i < 4; i++) y[i] = I16_FN(finish)(acc[i], &w[i], x->gsum);
}

/* One weight row against `rows` x rows, each pair by the 4-row kernel's operations. Inlined
 * per row count (below), so the accumulators live in registers. */
static I16_TARGET inline __attribute__((always_inline)) void I16_FN(rows_body)(
    const KhRow *w, const KhI16 *x, int64_t rows, float *y, int64_t y_stride)
{
    int64_t k = w->k, nb = k / 32, groups = k / w->group, b0, r;
    I16_ACC acc[KH_MAX_ROWS];
    __m256 sd[KH_MAX_ROWS];
    int p;
    for (r = 0; r < rows; r++) acc[r] = I16_ZERO;
    for (b0 = 0; b0 < nb; b0 += 8) {
        int count = nb - b0 < 8 ? (int)(nb - b0) : 8;
        _mm_prefetch((const char *)(w->q + b0 * 16 + KH_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(w->q + b0 * 16 + 64 + KH_PREFETCH), _MM_HINT_T0);
        for (r = 0; r < rows; r++) sd[r] = I16_FN(block_sd)(w, x->d + r * nb, b0, count);
        for (p = 0; p < count / 2; p++)
            for (r = 0; r < rows; r++)
                I16_PAIR(acc[r], sd[r], p, w->q + (b0 + 2 * p) * 16,
                         x->q + r * k + (b0 + 2 * p) * 32);
    }
    for (r = 0; r < rows; r++) y[r * y_stride] = I16_FN(finish)(acc[r], w, x->gsum + r * groups);
}

#define I16_ROWS(ROWS)                                                                     \
    static I16_TARGET void I16_FN(rows_##ROWS)(const KhRow *w, const KhI16 *x, float *y,   \
                                               int64_t y_stride)                           \
    {                                                                                      \
        I16_FN(rows_body)(w, x, ROWS, y, y_stride);                                        \
    }
I16_ROWS(1) I16_ROWS(2) I16_ROWS(3) I16_ROWS(4) I16_ROWS(5) I16_ROWS(6) I16_ROWS(7) I16_ROWS(8)
#undef I16_ROWS

void I16_FN(kh_i16_rows)(const KhRow *w, const KhI16 *x, int64_t rows, float *y,
                         int64_t y_stride)
{
    static void (*const by_rows[KH_MAX_ROWS + 1])(const KhRow *, const KhI16 *, float *,
                                                  int64_t) = {
        0, I16_FN(rows_1), I16_FN(rows_2), I16_FN(rows_3), I16_FN(rows_4), I16_FN(rows_5),
        I16_FN(rows_6), I16_FN(rows_7), I16_FN(rows_8)};
    by_rows[rows](w, x, y, y_stride);
}
