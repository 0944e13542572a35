/* kimi_attn.c: decode attention over fp16 caches, for llama_decode_layer (kimi_llama.c).
 *
 * Row r's query heads see its cache rows 0..positions[r]. The keys of a (row, KV head) are
 * cut into up to KH_ATTN_MAX_SPLITS ranges of at least KH_ATTN_SPLIT_KEYS keys; each range is
 * one pool task, which keeps an online softmax (running max m, sum l and the unnormalized
 * sum of values) per query head of the KV group, scores in fp32 as SDPA's CPU kernel keeps
 * them. The caller then merges the ranges: M = max m_s, out = sum_s e^(m_s - M) acc_s /
 * sum_s e^(m_s - M) l_s. So a long context runs on every thread (a single sequence with 3 KV
 * heads was 3 tasks), and each key is converted from fp16 once for the group's heads.
 * Memory traffic: 2 * kv_heads * head_dim * 2 bytes per cached token of each row. */
#include "kimi_simd.h"

#include <math.h>
#include <string.h>

#define KH_ATTN_CHUNK 64        /* keys scored per online-softmax step */
#define KH_ATTN_SPLIT_KEYS 256  /* keys per task at least */
#define KH_ATTN_MAX_SPLITS 16   /* key ranges per (row, KV head) at most */
#ifndef KH_ATTN_AHEAD
#define KH_ATTN_AHEAD 16        /* keys prefetched ahead: a (row, KV head)'s rows are strided */
#endif

typedef struct {
    const KhAttention *a;
    float *parts;               /* [rows, heads, MAX_SPLITS, part_floats]: m, l, acc */
    int64_t task_base[KH_MAX_ROWS + 1], splits[KH_MAX_ROWS], span[KH_MAX_ROWS];
} AttnJob;

/* m, l and acc [head_dim] of one key range, padded to whole cache lines. */
static int64_t part_floats(int64_t head_dim)
{
    return (head_dim + 2 + 15) / 16 * 16;
}

int64_t kh_attention_work_floats(int64_t rows, int64_t heads, int64_t head_dim)
{
    return rows * heads * KH_ATTN_MAX_SPLITS * part_floats(head_dim) + 16;
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

/* One task: the key range [j0, j1) of one (row, KV head), for each query head of its group. */
static inline __attribute__((always_inline)) void attend_range(
    const AttnJob *job, int64_t task, void (*to_floats)(const uint16_t *, float *, int64_t),
    void (*scores)(const float *, const float *, int64_t, int64_t, float, float *),
    void (*accumulate)(float *, const float *, const float *, int64_t, int64_t),
    float (*exp_sum)(float *, int64_t, float))
{
    const KhAttention *a = job->a;
    int64_t hd = a->head_dim, kvh = a->kv_heads, group = a->heads / kvh, row = 0, j, g, c0;
    int64_t kv, split, j0, j1;
    float scale = 1.0f / sqrtf((float)hd);
    float kv_f[KH_ATTN_CHUNK * KH_ATTN_MAX_DIM]; /* a chunk's keys, then values, as floats */
    float score[KH_ATTN_MAX_GROUP][KH_ATTN_CHUNK];
    while (task >= job->task_base[row + 1]) row++;
    task -= job->task_base[row];
    kv = task / job->splits[row];
    split = task % job->splits[row];
    j0 = split * job->span[row];
    j1 = j0 + job->span[row] < a->positions[row] + 1 ? j0 + job->span[row] : a->positions[row] + 1;
    {
        const float *q = a->q + row * a->q_stride + kv * group * hd;
        const uint16_t *kc = a->k_cache[row] + kv * hd, *vc = a->v_cache[row] + kv * hd;
        float top[KH_ATTN_MAX_GROUP], total[KH_ATTN_MAX_GROUP]; /* m, l */
        float acc[KH_ATTN_MAX_GROUP][KH_ATTN_MAX_DIM]; /* here, not in parts: no line shared */
        for (g = 0; g < group; g++) {
            top[g] = -INFINITY;
            total[g] = 0.0f;
            memset(acc[g], 0, (size_t)hd * sizeof(float));
        }
        for (c0 = j0; c0 < j1; c0 += KH_ATTN_CHUNK) {
            int64_t count = j1 - c0 < KH_ATTN_CHUNK ? j1 - c0 : KH_ATTN_CHUNK;
            for (j = 0; j < count; j++) { /* cache rows: [S_max, KVH, hd] */
                const uint16_t *ahead = kc + (c0 + j + KH_ATTN_AHEAD) * kvh * hd;
                __builtin_prefetch(ahead);
                __builtin_prefetch(ahead + hd - 1);
                to_floats(kc + (c0 + j) * kvh * hd, kv_f + j * hd, hd);
            }
            for (g = 0; g < group; g++) scores(q + g * hd, kv_f, count, hd, scale, score[g]);
            for (g = 0; g < group; g++) { /* rescale what came before to the new maximum */
                float m = top[g], fix;
                for (j = 0; j < count; j++) m = score[g][j] > m ? score[g][j] : m;
                fix = expf(top[g] - m);
                total[g] *= fix;
                for (j = 0; j < hd; j++) acc[g][j] *= fix;
                top[g] = m;
                total[g] += exp_sum(score[g], count, m);
            }
            for (j = 0; j < count; j++) {
                const uint16_t *ahead = vc + (c0 + j + KH_ATTN_AHEAD) * kvh * hd;
                __builtin_prefetch(ahead);
                __builtin_prefetch(ahead + hd - 1);
                to_floats(vc + (c0 + j) * kvh * hd, kv_f + j * hd, hd);
            }
            for (g = 0; g < group; g++) accumulate(acc[g], score[g], kv_f, count, hd);
        }
        for (g = 0; g < group; g++) {
            float *part = job->parts + ((row * a->heads + kv * group + g) * KH_ATTN_MAX_SPLITS
                                        + split) * part_floats(hd);
            part[0] = top[g];
            part[1] = total[g];
            memcpy(part + 2, acc[g], (size_t)hd * sizeof(float));
        }
    }
}

static void attend_range_c(void *ctx, int64_t task)
{
    attend_range(ctx, task, halves_to_floats_c, scores_c, accumulate_c, exp_sum_c);
}

#if KH_HAVE_X86_SIMD
#include <immintrin.h>
#define KH_TARGET __attribute__((target("avx2,fma,f16c")))

/* n % 8 == 0 for the three below (attention picks them only then). */
static KH_TARGET inline void halves_to_floats_avx2(const uint16_t *h, float *out, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
}

/* Two FMA chains (even and odd 8-lane steps): one chain held a head_dim-64 dot to 8 FMA
 * latencies, and the keys of a range wait on their scores. */
static KH_TARGET inline float dot_avx2(const float *a, const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps(), acc_odd = _mm256_setzero_ps();
    int64_t i;
    for (i = 0; i + 16 <= n; i += 16) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        acc_odd = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc_odd);
    }
    if (i < n) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    return hsum256(_mm256_add_ps(acc, acc_odd));
}

/* scores_c for 8 keys at a time: 8 accumulators over the head's lanes, then one transposing
 * hadd tree gives the 8 sums in one vector (per key, a dot's own horizontal sum and scalar
 * store held the scoring to their latency); the last count % 8 keys by dot_avx2. */
static KH_TARGET inline void scores_avx2(const float *q, const float *k, int64_t count,
                                         int64_t n, float scale, float *out)
{
    const __m256 sv = _mm256_set1_ps(scale);
    int64_t j, i;
    int u;
    for (j = 0; j + 8 <= count; j += 8) {
        __m256 a[8], t0, t1, t2, t3, u0, u1;
        for (u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
        for (i = 0; i < n; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            for (u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (j + u) * n + i), a[u]);
        }
        t0 = _mm256_hadd_ps(a[0], a[1]);
        t1 = _mm256_hadd_ps(a[2], a[3]);
        t2 = _mm256_hadd_ps(a[4], a[5]);
        t3 = _mm256_hadd_ps(a[6], a[7]);
        u0 = _mm256_hadd_ps(t0, t1);
        u1 = _mm256_hadd_ps(t2, t3);
        _mm256_storeu_ps(out + j, _mm256_mul_ps(sv, _mm256_add_ps(
            _mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))));
    }
    for (; j < count; j++) out[j] = dot_avx2(q, k + j * n, n) * scale;
}

/* accumulate_c's chains with 64 floats of y in registers across the chunk's rows (the axpy
 * per row stored y and loaded it back for the next: the store was 18% of an 8-row verify
 * step's attention); n % 8 == 0. */
static KH_TARGET inline void accumulate_avx2(float *y, const float *w, const float *v,
                                             int64_t count, int64_t n)
{
    int64_t i0, j;
    int u;
    for (i0 = 0; i0 < n; i0 += 64) {
        int lanes = n - i0 < 64 ? (int)(n - i0) / 8 : 8;
        __m256 acc[8];
        for (u = 0; u < lanes; u++) acc[u] = _mm256_loadu_ps(y + i0 + 8 * u);
        for (j = 0; j < count; j++) {
            __m256 wj = _mm256_set1_ps(w[j]);
            const float *row = v + j * n + i0;
            for (u = 0; u < lanes; u++) acc[u] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(row + 8 * u), acc[u]);
        }
        for (u = 0; u < lanes; u++) _mm256_storeu_ps(y + i0 + 8 * u, acc[u]);
    }
}

static KH_TARGET inline float exp_sum_avx2(float *s, int64_t n, float m)
{
    __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    float total;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = kh_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, v);
        sum = _mm256_add_ps(sum, v);
    }
    total = hsum256(sum);
    for (; j < n; j++) {
        s[j] = expf(s[j] - m);
        total += s[j];
    }
    return total;
}

static KH_TARGET void attend_range_avx2(void *ctx, int64_t task)
{
    attend_range(ctx, task, halves_to_floats_avx2, scores_avx2, accumulate_avx2, exp_sum_avx2);
}
#endif

void kh_attention(const KhAttention *a, float *work, int nthreads)
{
    AttnJob job;
    int64_t r, h, s, j, hd = a->head_dim, keys = 0;
    KhTask fn = attend_range_c;
#if KH_HAVE_X86_SIMD
    if (gemv_simd(-1) >= 1 && hd % 8 == 0) fn = attend_range_avx2;
#endif
    job.a = a;
    job.parts = work + (16 - ((uintptr_t)work / sizeof(float)) % 16) % 16; /* 64-byte lines */
    job.task_base[0] = 0;
    for (r = 0; r < a->rows; r++) {
        int64_t n = a->positions[r] + 1, splits = (n + KH_ATTN_SPLIT_KEYS - 1) / KH_ATTN_SPLIT_KEYS;
        job.splits[r] = splits < KH_ATTN_MAX_SPLITS ? splits : KH_ATTN_MAX_SPLITS;
        job.span[r] = (n + job.splits[r] - 1) / job.splits[r];
        job.splits[r] = (n + job.span[r] - 1) / job.span[r]; /* no empty range */
        job.task_base[r + 1] = job.task_base[r] + a->kv_heads * job.splits[r];
        keys += n;
    }
    kh_parallel(fn, &job, job.task_base[a->rows], nthreads,
                keys * 2 * a->heads * hd >= KH_SERIAL_BELOW);
    for (r = 0; r < a->rows; r++) /* merge each head's ranges */
        for (h = 0; h < a->heads; h++) {
            int64_t stride = part_floats(hd);
            const float *p = job.parts + (r * a->heads + h) * KH_ATTN_MAX_SPLITS * stride;
            float *out = a->out + (r * a->heads + h) * hd, top = -INFINITY, total = 0.0f;
            for (s = 0; s < job.splits[r]; s++) top = p[s * stride] > top ? p[s * stride] : top;
            for (j = 0; j < hd; j++) out[j] = 0.0f;
            for (s = 0; s < job.splits[r]; s++) {
                const float *part = p + s * stride;
                float w = expf(part[0] - top);
                total += w * part[1];
                for (j = 0; j < hd; j++) out[j] += w * part[2 + j];
            }
            for (j = 0; j < hd; j++) out[j] /= total;
        }
}
