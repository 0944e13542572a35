/* Internal to the C helper: decode attention's job and its per-task loop (kimi_attn.c), shared
 * with the AVX2 and AVX-512 chunk kernels (kimi_attn_avx2.c, kimi_attn_avx512.c) that the
 * loop is instantiated with there. */
#ifndef KIMI_ATTN_H
#define KIMI_ATTN_H

#include "kimi_simd.h"

#include <math.h>
#include <string.h>

#define KH_ATTN_CHUNK 64        /* keys scored per online-softmax step */
#define KH_ATTN_SPLIT_KEYS 256  /* keys a range holds at most, below KH_ATTN_MAX_SPLITS ranges */
#define KH_ATTN_MAX_SPLITS 16   /* key ranges per (row, KV head) at most */
#define KH_ATTN_TASK_HEADS 32  /* query heads one task may hold the state of */

typedef struct {
    const KhAttention *a;
    float *parts;               /* [rows, heads, MAX_SPLITS, part_floats]: m, l, acc */
    int64_t splits[KH_MAX_ROWS], span[KH_MAX_ROWS]; /* each row's key ranges */
    /* Rows of one cache whose ranges start at the same keys (a verify step's rows of one
     * sequence: kh_attention) form a group, order[first[g] .. first[g + 1]). A task is one key
     * range of a group, for one KV head or all of them (kv_per_task), and up to `block` of its
     * rows, one after another: the range's cache rows come from memory once, then from this
     * core's cache where they fit. */
    int64_t groups, order[KH_MAX_ROWS], first[KH_MAX_ROWS + 1], task_base[KH_MAX_ROWS + 1];
    int64_t group_splits[KH_MAX_ROWS], kv_per_task[KH_MAX_ROWS], block[KH_MAX_ROWS];
    int64_t blocks[KH_MAX_ROWS];
} KhAttnJob;

/* One (row, head)'s key ranges merged into its output (kimi_attn.c's merge_c). */
typedef void (*KhAttnMerge)(const float *p, int64_t splits, int64_t stride, int64_t hd,
                            float *out);

/* m, l and acc [head_dim] of one key range, padded to whole cache lines. */
static inline int64_t kh_attn_part_floats(int64_t head_dim)
{
    return (head_dim + 2 + 15) / 16 * 16;
}

/* score[g][j] = dot(q head g, key j) * scale for the `group` query heads at q ([group, hd])
 * and the `count` keys at k (fp16 rows `stride` halves apart); kv_f: scratch for
 * KH_ATTN_CHUNK * hd floats. Row j of `ahead` (rows as k's; NULL: none) is prefetched while
 * key j is scored: the rows the task reads next. */
typedef void (*KhScoreChunk)(const float *q, const uint16_t *k, int64_t stride, int64_t count,
                             int64_t hd, int64_t group, float scale,
                             float (*score)[KH_ATTN_CHUNK], float *kv_f, const uint16_t *ahead);
/* acc[g] += sum_j score[g][j] * value j, over j in order for each element (the chain
 * acc + w0 v0 + w1 v1 + ... in every kernel), for the values at v (rows as the keys); `ahead`
 * as above. */
typedef void (*KhAccumulateChunk)(float (*acc)[KH_ATTN_MAX_DIM], float (*score)[KH_ATTN_CHUNK],
                                  const uint16_t *v, int64_t stride, int64_t count, int64_t hd,
                                  int64_t group, float *kv_f, const uint16_t *ahead);

/* Prefetches row j of `rows` (its hd halves, a line at a time), if there are rows. A chunk's
 * values are fetched while its keys are scored, the next keys while the values are summed:
 * fetching a row a fixed distance ahead within one pass left each pass's first rows to miss
 * (a quarter of one-row attention's time at 8k tokens stalled on the first value load). */
static inline void kh_attn_prefetch(const uint16_t *rows, int64_t j, int64_t stride, int64_t hd)
{
    int64_t i;
    if (!rows) return;
    for (i = 0; i < hd; i += 32) __builtin_prefetch(rows + j * stride + i);
}

/* The larger of m and the n scores at s, as the chain `m = s[j] > m ? s[j] : m` over j gives
 * it, taken in 8 independent chains: the one chain, each step waiting on the last, was a fifth
 * of attention's time at 2,000 keys. A NaN score never wins in either; the order can change
 * only which zero's sign wins, which no exp(score - m) sees. The SIMD kernels' max_of keeps
 * the 8 chains in one register (kh_attn_max_avx2): the same result. */
static inline float kh_attn_max_rest(const float *s, int64_t j, int64_t n, float part[8])
{
    int l;
    for (; j < n; j++) part[0] = s[j] > part[0] ? s[j] : part[0]; /* the keys past whole 8s */
    for (l = 1; l < 8; l++) part[0] = part[l] > part[0] ? part[l] : part[0];
    return part[0];
}

static inline float kh_attn_max(const float *s, int64_t n, float m)
{
    float part[8];
    int64_t j;
    int l;
    for (l = 0; l < 8; l++) part[l] = m;
    for (j = 0; j + 8 <= n; j += 8)
        for (l = 0; l < 8; l++) part[l] = s[j + l] > part[l] ? s[j + l] : part[l];
    return kh_attn_max_rest(s, j, n, part);
}

/* One chunk of keys from c0 for the n query heads at q (the task's state from h0 on): the
 * scores, the online-softmax rescale to the new maximum, then the values. */
static inline __attribute__((always_inline)) void kh_attend_chunk(
    const KhAttention *a, const float *q, int64_t kv, int64_t c0, int64_t count, int64_t n,
    const uint16_t *next, float *top, float *total, float (*acc)[KH_ATTN_MAX_DIM],
    float (*score)[KH_ATTN_CHUNK], float *kv_f, int64_t row, KhScoreChunk score_chunk,
    KhAccumulateChunk accumulate_chunk, float (*max_of)(const float *, int64_t, float),
    float (*exp_sum)(float *, int64_t, float))
{
    int64_t hd = a->head_dim, stride = a->kv_heads * hd, g, j;
    const uint16_t *kc = a->k_cache[row] + kv * hd, *vc = a->v_cache[row] + kv * hd;
    score_chunk(q, kc + c0 * stride, stride, count, hd, n, 1.0f / sqrtf((float)hd), score, kv_f,
                vc + c0 * stride);
    for (g = 0; g < n; g++) {
        float m = max_of(score[g], count, top[g]), fix = expf(top[g] - m);
        total[g] *= fix;
        for (j = 0; j < hd; j++) acc[g][j] *= fix;
        top[g] = m;
        total[g] += exp_sum(score[g], count, m);
    }
    accumulate_chunk(acc, score, vc + c0 * stride, stride, count, hd, n, kv_f, next);
}

/* The key range `split` of `n` rows of one cache, for the query heads of KV heads kv0..kv1-1:
 * per chunk of keys and KV head, kh_attend_chunk. With all KV heads at once, a chunk's cache
 * rows are read whole, each while the last was: a task of one KV head read a third of every
 * row. The chunks every row has whole are scored for the rows together, their heads of a KV
 * head side by side (a verify step's rows: each key converted once for two rows' heads on
 * AVX-512); each row's other chunks, from the same boundaries, on its own. Every (row, head)
 * takes the operations it takes alone, so the result is the row's own, whatever task runs it
 * and whatever rows share it. State: ((kv - kv0) * n + r) * group + g. */
static inline __attribute__((always_inline)) void kh_attend_rows_range(
    const KhAttnJob *job, const int64_t *rows, int64_t n, int64_t kv0, int64_t kv1,
    int64_t split, KhScoreChunk score_chunk, KhAccumulateChunk accumulate_chunk,
    float (*max_of)(const float *, int64_t, float), float (*exp_sum)(float *, int64_t, float))
{
    const KhAttention *a = job->a;
    int64_t hd = a->head_dim, group = a->heads / a->kv_heads, stride = a->kv_heads * hd;
    int64_t per_kv = n * group, j0 = split * job->span[rows[0]], j1[KH_MAX_ROWS], whole, c0;
    int64_t kv, r, g;
    float kv_f[KH_ATTN_CHUNK * KH_ATTN_MAX_DIM]; /* the portable kernels' converted rows */
    float score[KH_ATTN_TASK_HEADS][KH_ATTN_CHUNK];
    float top[KH_ATTN_TASK_HEADS], total[KH_ATTN_TASK_HEADS]; /* m, l of the task's heads */
    float acc[KH_ATTN_TASK_HEADS][KH_ATTN_MAX_DIM]; /* here, not in parts: no line shared */
    float q[KH_ATTN_TASK_HEADS * KH_ATTN_MAX_DIM];  /* the rows' heads side by side (n > 1) */
    whole = INT64_MAX;
    for (r = 0; r < n; r++) {
        j1[r] = j0 + job->span[rows[r]] < a->positions[rows[r]] + 1
            ? j0 + job->span[rows[r]] : a->positions[rows[r]] + 1;
        whole = j1[r] < whole ? j1[r] : whole;
    }
    /* one row: every chunk, its last one short (the loop it always ran); else whole ones */
    whole = n == 1 ? whole : j0 + (whole - j0) / KH_ATTN_CHUNK * KH_ATTN_CHUNK;
    for (g = 0; g < (kv1 - kv0) * per_kv; g++) {
        top[g] = -INFINITY;
        total[g] = 0.0f;
        memset(acc[g], 0, (size_t)hd * sizeof(float));
    }
    for (kv = kv0; kv < kv1 && n > 1; kv++)
        for (r = 0; r < n; r++)
            memcpy(q + ((kv - kv0) * per_kv + r * group) * hd,
                   a->q + rows[r] * a->q_stride + kv * group * hd, (size_t)(group * hd) * sizeof(float));
    for (c0 = j0; c0 < whole; c0 += KH_ATTN_CHUNK) {
        int64_t count = whole - c0 < KH_ATTN_CHUNK ? whole - c0 : KH_ATTN_CHUNK;
        for (kv = kv0; kv < kv1; kv++) {
            int64_t h0 = (kv - kv0) * per_kv; /* the task's first head of this KV head */
            /* the keys read next: the next KV head's, or the next chunk's when it is whole (its
             * rows past the range need not be the cache's: no pointer is made to them) */
            const uint16_t *next = kv + 1 < kv1 ? a->k_cache[rows[0]] + (kv + 1) * hd + c0 * stride
                : c0 + 2 * KH_ATTN_CHUNK <= whole ? a->k_cache[rows[0]] + kv0 * hd + (c0 + KH_ATTN_CHUNK) * stride
                : NULL;
            kh_attend_chunk(a, n > 1 ? q + h0 * hd : a->q + rows[0] * a->q_stride + kv * group * hd,
                            kv, c0, count, per_kv, next, top + h0, total + h0, acc + h0, score,
                            kv_f, rows[0], score_chunk, accumulate_chunk, max_of, exp_sum);
        }
    }
    for (r = 0; r < n; r++) /* the rows' own chunks past the shared whole ones */
        for (c0 = whole; c0 < j1[r]; c0 += KH_ATTN_CHUNK)
            for (kv = kv0; kv < kv1; kv++) {
                int64_t h0 = ((kv - kv0) * n + r) * group;
                kh_attend_chunk(a, a->q + rows[r] * a->q_stride + kv * group * hd, kv, c0,
                                j1[r] - c0 < KH_ATTN_CHUNK ? j1[r] - c0 : KH_ATTN_CHUNK, group,
                                NULL, top + h0, total + h0, acc + h0, score, kv_f, rows[r],
                                score_chunk, accumulate_chunk, max_of, exp_sum);
            }
    for (kv = kv0; kv < kv1; kv++)
        for (r = 0; r < n; r++)
            for (g = 0; g < group; g++) {
                int64_t h = ((kv - kv0) * n + r) * group + g;
                float *part = job->parts + ((rows[r] * a->heads + kv * group + g) * KH_ATTN_MAX_SPLITS
                                            + split) * kh_attn_part_floats(hd);
                part[0] = top[h];
                part[1] = total[h];
                memcpy(part + 2, acc[h], (size_t)hd * sizeof(float));
            }
}

/* One task (kh_attention's plan): a key range of up to `block` rows of a group, for the task's
 * KV heads: as many rows at a time as the task's heads allow (kh_attend_rows_range). */
static inline __attribute__((always_inline)) void kh_attend_range(
    const KhAttnJob *job, int64_t task, KhScoreChunk score_chunk,
    KhAccumulateChunk accumulate_chunk, float (*max_of)(const float *, int64_t, float),
    float (*exp_sum)(float *, int64_t, float))
{
    int64_t g = 0, split, kv0, i, end, rows[KH_MAX_ROWS], n = 0, most, r;
    while (task >= job->task_base[g + 1]) g++;
    task -= job->task_base[g];
    i = job->first[g] + task % job->blocks[g] * job->block[g];
    end = i + job->block[g] < job->first[g + 1] ? i + job->block[g] : job->first[g + 1];
    task /= job->blocks[g];
    split = task % job->group_splits[g];
    kv0 = task / job->group_splits[g] * job->kv_per_task[g];
    most = KH_ATTN_TASK_HEADS / (job->kv_per_task[g] * (job->a->heads / job->a->kv_heads));
    for (; i < end; i++) /* a row of fewer keys may end before this range */
        if (split < job->splits[job->order[i]]) rows[n++] = job->order[i];
    for (r = 0; r < n; r += most)
        kh_attend_rows_range(job, rows + r, n - r < most ? n - r : most, kv0,
                             kv0 + job->kv_per_task[g], split, score_chunk, accumulate_chunk,
                             max_of, exp_sum);
}

#if KH_HAVE_X86_SIMD
/* The head and element passes of the SIMD chunk kernels, written once for AVX2 and AVX-512
 * (kimi_attn_avx2.c, kimi_attn_avx512.c). The includer defines KH_TARGET and the
 * always-inline kernels for hb = 1..KH_ATTN_PASS_HEADS query heads of a KV group:
 *   score_heads(q, k, stride, count, hd, hb, scale, score, ahead): their scores, and
 *   accumulate_lanes(acc, score, v, stride, count, hd, hb, lanes, i0, ahead): their values'
 *     sums for `lanes` registers of WIDTH elements from element i0;
 * then KH_ATTN_PASSES(ACCUMULATE, WIDTH) gives score_groups (a group's heads, a pass of up to
 * PASS at a time; `ahead` prefetched by the first) and ACCUMULATE, the accumulate-chunk kernel
 * (the same passes of heads; passes of 4 registers of elements, hd a multiple of WIDTH), each
 * count a constant in the calls, so that the accumulators stay in registers. */
#define KH_ATTN_PASS_HEADS 3 /* AVX2's heads a pass (16 ymm registers) */
#define KH_ATTN_PASS_HEADS_512 6 /* AVX-512's (32 zmm): a verify step's two rows of a KV head */
/* One pass of hb = min(n, PASS) heads, hb a constant in each call; a case above PASS is
 * never taken, and passes 1 so as not to instantiate a kernel wider than its arrays. */
#define KH_ATTN_BY_HEADS(n, PASS, CALL)                                                        \
    switch ((n) < (PASS) ? (n) : (PASS)) {                                                     \
    case 1: CALL(1); break;                                                                    \
    case 2: CALL(2); break;                                                                    \
    case 3: CALL(3); break;                                                                    \
    case 4: CALL((PASS) >= 4 ? 4 : 1); break;                                                  \
    case 5: CALL((PASS) >= 5 ? 5 : 1); break;                                                  \
    default: CALL((PASS) >= 6 ? 6 : 1); break;                                                 \
    }
#define KH_ATTN_SCORE_PASS(hb) score_heads(qg, k, stride, count, hd, hb, scale, score + g0, ahead)
#define KH_ATTN_LANES_PASS(lanes) \
    accumulate_lanes(acc, score, v, stride, count, hd, hb, lanes, i0, ahead)
#define KH_ATTN_HEADS_PASS(hb) \
    accumulate_heads(acc + g0, score + g0, v, stride, count, hd, hb, ahead)
#define KH_ATTN_PASSES(ACCUMULATE, WIDTH, PASS)                                                \
    static KH_TARGET inline __attribute__((always_inline)) void score_groups(                  \
        const float *q, const uint16_t *k, int64_t stride, int64_t count, int64_t hd,           \
        int64_t group, float scale, float (*score)[KH_ATTN_CHUNK], const uint16_t *ahead)       \
    {                                                                                          \
        int64_t g0;                                                                            \
        for (g0 = 0; g0 < group; g0 += (PASS), ahead = NULL) {                                 \
            const float *qg = q + g0 * hd;                                                     \
            KH_ATTN_BY_HEADS(group - g0, PASS, KH_ATTN_SCORE_PASS)                             \
        }                                                                                      \
    }                                                                                          \
    static KH_TARGET inline __attribute__((always_inline)) void accumulate_heads(              \
        float (*acc)[KH_ATTN_MAX_DIM], float (*score)[KH_ATTN_CHUNK], const uint16_t *v,       \
        int64_t stride, int64_t count, int64_t hd, int hb, const uint16_t *ahead)              \
    {                                                                                          \
        int64_t i0;                                                                            \
        for (i0 = 0; i0 < hd; i0 += 4 * (WIDTH), ahead = NULL) {                               \
            switch (hd - i0 < 4 * (WIDTH) ? (int)(hd - i0) / (WIDTH) : 4) {                    \
            case 1: KH_ATTN_LANES_PASS(1); break;                                              \
            case 2: KH_ATTN_LANES_PASS(2); break;                                              \
            case 3: KH_ATTN_LANES_PASS(3); break;                                              \
            default: KH_ATTN_LANES_PASS(4); break;                                             \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    static KH_TARGET void ACCUMULATE(float (*acc)[KH_ATTN_MAX_DIM],                            \
                                     float (*score)[KH_ATTN_CHUNK], const uint16_t *v,         \
                                     int64_t stride, int64_t count, int64_t hd, int64_t group, \
                                     float *kv_f, const uint16_t *ahead)                       \
    {                                                                                          \
        int64_t g0;                                                                            \
        (void)kv_f;                                                                            \
        for (g0 = 0; g0 < group; g0 += (PASS), ahead = NULL) {                                 \
            KH_ATTN_BY_HEADS(group - g0, PASS, KH_ATTN_HEADS_PASS)                             \
        }                                                                                      \
    }

void kh_attend_range_avx2(void *ctx, int64_t task);
void kh_attend_range_avx512(void *ctx, int64_t task); /* head_dim % 16 == 0 */
void kh_attn_merge_avx512(const float *p, int64_t splits, int64_t stride, int64_t hd,
                          float *out); /* kimi_attn.c's merge_c; head_dim % 16 == 0 */
/* The AVX2 score kernel and exp-sum, which the AVX-512 kernels share (the same bits). */
void kh_attn_score_chunk_avx2(const float *q, const uint16_t *k, int64_t stride, int64_t count,
                              int64_t hd, int64_t group, float scale,
                              float (*score)[KH_ATTN_CHUNK], float *kv_f, const uint16_t *ahead);
float kh_attn_exp_sum_avx2(float *s, int64_t n, float m);
float kh_attn_exp_sum_tail(float *s, int64_t n, float m, int64_t j, __m256 sum);
float kh_attn_max_avx2(const float *s, int64_t n, float m);
#endif

#endif
