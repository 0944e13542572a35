/* kimi_attn.c: decode attention over fp16 caches, for llama_decode_layer (kimi_llama.c).
 *
 * Row r's query heads see its cache rows 0..positions[r]. The keys of a row are cut into
 * ranges of up to KH_ATTN_SPLIT_KEYS keys (longer once that would make more than
 * KH_ATTN_MAX_SPLITS of them). A range is one pool task for all the row's KV heads (one task a
 * KV head where the row's group has one range, so the threads still share it), and for the
 * other rows of its cache whose ranges are its own: a verify step's rows of one sequence read
 * the range from memory once, then from the core's cache where it fits (5 rows 4,250 keys deep
 * took about 9% less time), and the chunks they all hold whole are scored for the rows together
 * (kh_attend_rows_range: on AVX-512 two rows' heads of a KV head in one pass, each key
 * converted once for both). Each task keeps an online softmax (running max m, sum l and the
 * unnormalized sum of values) per query head, scores in fp32 as SDPA's CPU kernel keeps them.
 * The caller then merges the ranges: M = max m_s, out = sum_s e^(m_s - M) acc_s /
 * sum_s e^(m_s - M) l_s. So a long context runs on every thread (a single sequence with 3 KV
 * heads was 3 tasks), and each key is converted from fp16 once for the group's heads (the
 * portable kernels below into a float buffer; the AVX2 and AVX-512 ones, kimi_attn_avx2.c and
 * kimi_attn_avx512.c, in registers; attention_simd says which runs).
 * Memory traffic: 2 * kv_heads * head_dim * 2 bytes per cached token of each row, or of each
 * task's rows together. */
#include "kimi_attn.h"

int64_t kh_attention_work_floats(int64_t rows, int64_t heads, int64_t head_dim)
{
    return rows * heads * KH_ATTN_MAX_SPLITS * kh_attn_part_floats(head_dim) + 16;
}

static void halves_to_floats_c(const uint16_t *h, float *out, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++) out[i] = kh_half_to_float(h[i]);
}

/* 8 independent partial sums: vectorizable without reassociation. */
static float dot_c(const float *a, const float *b, int64_t n)
{
    float part[8] = {0};
    int64_t i, l;
    for (i = 0; i + 8 <= n; i += 8)
        for (l = 0; l < 8; l++) part[l] += a[i + l] * b[i + l];
    for (; i < n; i++) part[0] += a[i] * b[i];
    return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

/* out[j] = dot(q, k row j) * scale for count rows k [count, n]. */
static void scores_c(const float *q, const float *k, int64_t count, int64_t n, float scale,
                     float *out)
{
    int64_t j;
    for (j = 0; j < count; j++) out[j] = dot_c(q, k + j * n, n) * scale;
}

/* y += sum_j w[j] * v[j] for count rows v [count, n], one row after another (each y[i] is
 * the chain y[i] + w[0] v[0][i] + w[1] v[1][i] + ..., in that order, in every kernel). */
static void accumulate_c(float *y, const float *w, const float *v, int64_t count, int64_t n)
{
    int64_t i, j;
    for (j = 0; j < count; j++)
        for (i = 0; i < n; i++) y[i] += w[j] * v[j * n + i];
}

/* s[j] = exp(s[j] - m) for j < n; returns their sum. */
static float exp_sum_c(float *s, int64_t n, float m)
{
    float total = 0.0f;
    int64_t j;
    for (j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        total += s[j];
    }
    return total;
}

/* The portable chunk kernels: the rows converted to floats once (kv_f), then each head. */
static void score_chunk_c(const float *q, const uint16_t *k, int64_t stride, int64_t count,
                          int64_t hd, int64_t group, float scale, float (*score)[KH_ATTN_CHUNK],
                          float *kv_f, const uint16_t *ahead)
{
    int64_t j, g;
    for (j = 0; j < count; j++) {
        kh_attn_prefetch(ahead, j, stride, hd);
        halves_to_floats_c(k + j * stride, kv_f + j * hd, hd);
    }
    for (g = 0; g < group; g++) scores_c(q + g * hd, kv_f, count, hd, scale, score[g]);
}

static void accumulate_chunk_c(float (*acc)[KH_ATTN_MAX_DIM], float (*score)[KH_ATTN_CHUNK],
                               const uint16_t *v, int64_t stride, int64_t count, int64_t hd,
                               int64_t group, float *kv_f, const uint16_t *ahead)
{
    int64_t j, g;
    for (j = 0; j < count; j++) {
        kh_attn_prefetch(ahead, j, stride, hd);
        halves_to_floats_c(v + j * stride, kv_f + j * hd, hd);
    }
    for (g = 0; g < group; g++) accumulate_c(acc[g], score[g], kv_f, count, hd);
}

static void attend_range_c(void *ctx, int64_t task)
{
    kh_attend_range(ctx, task, score_chunk_c, accumulate_chunk_c, kh_attn_max, exp_sum_c);
}

int attention_simd(int64_t head_dim)
{
#if KH_HAVE_X86_SIMD
    int level = gemv_simd(-1);
    if (level >= 2 && head_dim % 16 == 0) return 2;
    if (level >= 1 && head_dim % 8 == 0) return 1;
#endif
    (void)head_dim;
    return 0;
}

/* Row r's keys 0..positions[r] in ranges of `span` keys from 0 (the last may be shorter): as
 * many as KH_ATTN_SPLIT_KEYS gives, up to KH_ATTN_MAX_SPLITS, sized from the keys rounded up
 * to a whole chunk, so that the rows of a verify step (one sequence at positions p..p+k) share
 * their ranges unless a multiple of KH_ATTN_CHUNK falls among them. Rows of one cache and one
 * span form a group (order, first); a group's tasks take `block` of its rows each, as many as
 * leave about two tasks a thread in all (one row a task when there are no more than that), in
 * blocks as even as the rows allow. */
static int64_t plan(KhAttnJob *job, const KhAttention *a, int nthreads)
{
    int64_t r, s, g, n, whole, splits, keys = 0, units = 0, per, count, target;
    int grouped[KH_MAX_ROWS] = {0};
    target = 2 * (int64_t)(nthreads > 1 ? nthreads : 1);
    for (r = 0; r < a->rows; r++) {
        n = a->positions[r] + 1;
        whole = (n + KH_ATTN_CHUNK - 1) / KH_ATTN_CHUNK * KH_ATTN_CHUNK;
        splits = (whole + KH_ATTN_SPLIT_KEYS - 1) / KH_ATTN_SPLIT_KEYS;
        splits = splits < KH_ATTN_MAX_SPLITS ? splits : KH_ATTN_MAX_SPLITS;
        job->span[r] = (whole + splits - 1) / splits;
        job->splits[r] = (n + job->span[r] - 1) / job->span[r]; /* no empty range */
        keys += n;
    }
    job->first[0] = 0;
    for (g = 0, r = 0; r < a->rows; r++) {
        if (grouped[r]) continue;
        count = job->first[g];
        job->group_splits[g] = 0;
        for (s = r; s < a->rows; s++)
            if (!grouped[s] && a->k_cache[s] == a->k_cache[r] && a->v_cache[s] == a->v_cache[r]
                && job->span[s] == job->span[r]) {
                grouped[s] = 1;
                job->order[count++] = s;
                if (job->splits[s] > job->group_splits[g]) job->group_splits[g] = job->splits[s];
            }
        /* a group split over its keys has tasks enough: each takes every KV head, reading its
         * rows whole; one range of keys stays a task per KV head, to keep the threads busy.
         * The ranges, and so every result, are the same either way. */
        job->kv_per_task[g] = job->group_splits[g] > 1 && a->heads <= KH_ATTN_TASK_HEADS
            ? a->kv_heads : 1;
        units += a->kv_heads / job->kv_per_task[g] * job->group_splits[g] * (count - job->first[g]);
        job->first[++g] = count;
    }
    per = units > target ? (units + target - 1) / target : 1;
    job->task_base[0] = 0;
    for (r = 0; r < g; r++) {
        count = job->first[r + 1] - job->first[r];
        job->blocks[r] = (count + per - 1) / per;  /* 8 rows, per 6: two blocks of 4 */
        job->block[r] = (count + job->blocks[r] - 1) / job->blocks[r];
        job->task_base[r + 1] = job->task_base[r] + a->kv_heads / job->kv_per_task[r]
                                * job->group_splits[r] * job->blocks[r];
    }
    job->groups = g;
    return keys;
}

int64_t kh_attention_tasks(const KhAttention *a, int nthreads)
{
    KhAttnJob job;
    int64_t r;
    if (a->rows < 1 || a->rows > KH_MAX_ROWS || nthreads < 1 || a->kv_heads < 1
        || a->heads % a->kv_heads)
        return -1;
    for (r = 0; r < a->rows; r++)
        if (a->positions[r] < 0) return -1;
    plan(&job, a, nthreads);
    return job.task_base[job.groups];
}

/* out [hd] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the `splits` parts at p
 * (`stride` floats apart: m, l, acc), M = max m_s. */
static void merge_c(const float *p, int64_t splits, int64_t stride, int64_t hd, float *out)
{
    float top = -INFINITY, total = 0.0f;
    int64_t s, j;
    for (s = 0; s < splits; s++) top = p[s * stride] > top ? p[s * stride] : top;
    for (j = 0; j < hd; j++) out[j] = 0.0f;
    for (s = 0; s < splits; s++) {
        const float *part = p + s * stride;
        float w = expf(part[0] - top);
        total += w * part[1];
        for (j = 0; j < hd; j++) out[j] += w * part[2 + j];
    }
    for (j = 0; j < hd; j++) out[j] /= total;
}

void kh_attention(const KhAttention *a, float *work, int nthreads)
{
    KhAttnJob job;
    int64_t r, h, hd = a->head_dim, keys;
    KhTask fn = attend_range_c;
    KhAttnMerge merge = merge_c;
#if KH_HAVE_X86_SIMD
    switch (attention_simd(hd)) {
    case 2:
        fn = kh_attend_range_avx512;
        merge = kh_attn_merge_avx512;
        break;
    case 1: fn = kh_attend_range_avx2; break;
    default: break;
    }
#endif
    job.a = a;
    job.parts = work + (16 - ((uintptr_t)work / sizeof(float)) % 16) % 16; /* 64-byte lines */
    keys = plan(&job, a, nthreads);
    kh_parallel(fn, &job, job.task_base[job.groups], nthreads,
                keys * 2 * a->heads * hd >= KH_SERIAL_BELOW);
    for (r = 0; r < a->rows; r++) /* merge each head's ranges */
        for (h = 0; h < a->heads; h++)
            merge(job.parts + (r * a->heads + h) * KH_ATTN_MAX_SPLITS * kh_attn_part_floats(hd),
                  job.splits[r], kh_attn_part_floats(hd), hd, a->out + (r * a->heads + h) * hd);
}
