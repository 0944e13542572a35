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

/* The key range `split` of one row, for the query heads of KV heads kv0..kv1-1: per chunk of
 * keys and KV head, the scores, the online-softmax rescale, then the values. With all KV heads
 * at once, a chunk's cache rows are read whole, each while the last was: a task of one KV head
 * read a third of every row. The result is the row's own: the same whatever task runs it. */
static inline __attribute__((always_inline)) void kh_attend_row_range(
    const KhAttnJob *job, int64_t row, int64_t kv0, int64_t kv1, int64_t split,
    KhScoreChunk score_chunk, KhAccumulateChunk accumulate_chunk,
    float (*max_of)(const float *, int64_t, float), float (*exp_sum)(float *, int64_t, float))
{
    const KhAttention *a = job->a;
    int64_t hd = a->head_dim, kvh = a->kv_heads, group = a->heads / kvh, j, g, c0;
    int64_t kv, stride = kvh * hd, j0 = split * job->span[row], j1 = j0 + job->span[row];
    float scale = 1.0f / sqrtf((float)hd);
    float kv_f[KH_ATTN_CHUNK * KH_ATTN_MAX_DIM]; /* the portable kernels' converted rows */
    float score[KH_ATTN_MAX_GROUP][KH_ATTN_CHUNK];
    float top[KH_ATTN_TASK_HEADS], total[KH_ATTN_TASK_HEADS]; /* m, l of the task's heads */
    float acc[KH_ATTN_TASK_HEADS][KH_ATTN_MAX_DIM]; /* here, not in parts: no line shared */
    j1 = j1 < a->positions[row] + 1 ? j1 : a->positions[row] + 1;
    for (g = 0; g < (kv1 - kv0) * group; g++) {
        top[g] = -INFINITY;
        total[g] = 0.0f;
        memset(acc[g], 0, (size_t)hd * sizeof(float));
    }
    for (c0 = j0; c0 < j1; c0 += KH_ATTN_CHUNK) {
        int64_t count = j1 - c0 < KH_ATTN_CHUNK ? j1 - c0 : KH_ATTN_CHUNK;
        for (kv = kv0; kv < kv1; kv++) {
            const float *q = a->q + row * a->q_stride + kv * group * hd;
            const uint16_t *kc = a->k_cache[row] + kv * hd, *vc = a->v_cache[row] + kv * hd;
            /* the keys read next: the next KV head's, or the next chunk's when it is whole (its
             * rows past j1 need not be the cache's: no pointer is made to them) */
            const uint16_t *next = kv + 1 < kv1 ? kc + hd + c0 * stride
                : c0 + 2 * KH_ATTN_CHUNK <= j1 ? a->k_cache[row] + kv0 * hd + (c0 + KH_ATTN_CHUNK) * stride
                : NULL;
            int64_t h0 = (kv - kv0) * group; /* the task's first head of this KV head */
            score_chunk(q, kc + c0 * stride, stride, count, hd, group, scale, score, kv_f,
                        vc + c0 * stride);
            for (g = 0; g < group; g++) { /* rescale what came before to the new maximum */
                float m = max_of(score[g], count, top[h0 + g]), fix;
                fix = expf(top[h0 + g] - m);
                total[h0 + g] *= fix;
                for (j = 0; j < hd; j++) acc[h0 + g][j] *= fix;
                top[h0 + g] = m;
                total[h0 + g] += exp_sum(score[g], count, m);
            }
            accumulate_chunk(acc + h0, score, vc + c0 * stride, stride, count, hd, group, kv_f,
                             next);
        }
    }
    for (g = 0; g < (kv1 - kv0) * group; g++) {
        float *part = job->parts + ((row * a->heads + kv0 * group + g) * KH_ATTN_MAX_SPLITS + split)
                                   * kh_attn_part_floats(hd);
        part[0] = top[g];
        part[1] = total[g];
        memcpy(part + 2, acc[g], (size_t)hd * sizeof(float));
    }
}

/* One task (kh_attention's plan): a key range of up to `block` rows of a group, each row in
 * turn, for the task's KV heads. */
static inline __attribute__((always_inline)) void kh_attend_range(
    const KhAttnJob *job, int64_t task, KhScoreChunk score_chunk,
    KhAccumulateChunk accumulate_chunk, float (*max_of)(const float *, int64_t, float),
    float (*exp_sum)(float *, int64_t, float))
{
    int64_t g = 0, split, kv0, i, end;
    while (task >= job->task_base[g + 1]) g++;
    task -= job->task_base[g];
    i = job->first[g] + task % job->blocks[g] * job->block[g];
    end = i + job->block[g] < job->first[g + 1] ? i + job->block[g] : job->first[g + 1];
    task /= job->blocks[g];
    split = task % job->group_splits[g];
    kv0 = task / job->group_splits[g] * job->kv_per_task[g];
    for (; i < end; i++) /* a row of fewer keys may end before this range */
        if (split < job->splits[job->order[i]])
            kh_attend_row_range(job, job->order[i], kv0, kv0 + job->kv_per_task[g], split,
                                score_chunk, accumulate_chunk, max_of, exp_sum);
}

#if KH_HAVE_X86_SIMD
/* The head and element passes of the SIMD chunk kernels, written once for AVX2 and AVX-512
 * (kimi_attn_avx2.c, kimi_attn_avx512.c). The includer defines KH_TARGET and the
 * always-inline kernels for hb = 1..KH_ATTN_PASS_HEADS query heads of a KV group:
 *   score_heads(q, k, stride, count, hd, hb, scale, score, ahead): their scores, and
 *   accumulate_lanes(acc, score, v, stride, count, hd, hb, lanes, i0, ahead): their values'
 *     sums for `lanes` registers of WIDTH elements from element i0;
 * then KH_ATTN_PASSES(ACCUMULATE, WIDTH) gives score_groups (a group's heads, a pass of up to
 * 3 at a time; `ahead` prefetched by the first) and ACCUMULATE, the accumulate-chunk kernel
 * (the same passes of heads; passes of 4 registers of elements, hd a multiple of WIDTH), each
 * count a constant in the calls, so that the accumulators stay in registers. */
#define KH_ATTN_PASS_HEADS 3
#define KH_ATTN_PASSES(ACCUMULATE, WIDTH)                                                      \
    static KH_TARGET inline __attribute__((always_inline)) void score_groups(                  \
        const float *q, const uint16_t *k, int64_t stride, int64_t count, int64_t hd,           \
        int64_t group, float scale, float (*score)[KH_ATTN_CHUNK], const uint16_t *ahead)       \
    {                                                                                          \
        int64_t g0;                                                                            \
        for (g0 = 0; g0 < group; g0 += KH_ATTN_PASS_HEADS, ahead = NULL) {                     \
            const float *qg = q + g0 * hd;                                                     \
            switch (group - g0 < KH_ATTN_PASS_HEADS ? group - g0 : KH_ATTN_PASS_HEADS) {       \
            case 1: score_heads(qg, k, stride, count, hd, 1, scale, score + g0, ahead); break;  \
            case 2: score_heads(qg, k, stride, count, hd, 2, scale, score + g0, ahead); break;  \
            default: score_heads(qg, k, stride, count, hd, 3, scale, score + g0, ahead); break; \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    static KH_TARGET inline __attribute__((always_inline)) void accumulate_heads(              \
        float (*acc)[KH_ATTN_MAX_DIM], float (*score)[KH_ATTN_CHUNK], const uint16_t *v,       \
        int64_t stride, int64_t count, int64_t hd, int hb, const uint16_t *ahead)              \
    {                                                                                          \
        int64_t i0;                                                                            \
        for (i0 = 0; i0 < hd; i0 += 4 * (WIDTH), ahead = NULL) {                               \
            switch (hd - i0 < 4 * (WIDTH) ? (int)(hd - i0) / (WIDTH) : 4) {                    \
            case 1: accumulate_lanes(acc, score, v, stride, count, hd, hb, 1, i0, ahead); break; \
            case 2: accumulate_lanes(acc, score, v, stride, count, hd, hb, 2, i0, ahead); break; \
            case 3: accumulate_lanes(acc, score, v, stride, count, hd, hb, 3, i0, ahead); break; \
            default: accumulate_lanes(acc, score, v, stride, count, hd, hb, 4, i0, ahead); break; \
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
        for (g0 = 0; g0 < group; g0 += KH_ATTN_PASS_HEADS, ahead = NULL) {                     \
            switch (group - g0 < KH_ATTN_PASS_HEADS ? group - g0 : KH_ATTN_PASS_HEADS) {       \
            case 1: accumulate_heads(acc + g0, score + g0, v, stride, count, hd, 1, ahead); break; \
            case 2: accumulate_heads(acc + g0, score + g0, v, stride, count, hd, 2, ahead); break; \
            default: accumulate_heads(acc + g0, score + g0, v, stride, count, hd, 3, ahead); break; \
            }                                                                                  \
        }                                                                                      \
    }

void kh_attend_range_avx2(void *ctx, int64_t task);
void kh_attend_range_avx512(void *ctx, int64_t task); /* head_dim % 16 == 0 */
/* The AVX2 score kernel and exp-sum, which the AVX-512 kernels share (the same bits). */
void kh_attn_score_chunk_avx2(const float *q, const uint16_t *k, int64_t stride, int64_t count,
                              int64_t hd, int64_t group, float scale,
                              float (*score)[KH_ATTN_CHUNK], float *kv_f, const uint16_t *ahead);
float kh_attn_exp_sum_avx2(float *s, int64_t n, float m);
float kh_attn_exp_sum_tail(float *s, int64_t n, float m, int64_t j, __m256 sum);
float kh_attn_max_avx2(const float *s, int64_t n, float m);
#endif

#endif
