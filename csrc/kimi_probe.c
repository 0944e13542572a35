/* kimi_probe.c: the memory read-bandwidth probe (see kimi_helper.h, read_probe).
 *
 * The ceiling the GEMV benchmarks compare against has to be one no kernel can beat: the same
 * threads as the kernels (kh_parallel's pool), streaming reads with eight independent
 * accumulators so neither latency nor the adds limit it, and a result the compiler cannot
 * drop (a checksum per chunk, summed by the caller). */
#include "kimi_helper.h"
#include "kimi_simd.h"

#define PROBE_CHUNK (1 << 20)   /* bytes per chunk: long sequential runs per thread */
#define PROBE_MAX_CHUNKS 4096

typedef struct {
    const uint64_t *words;
    int64_t words_per_chunk, total_words;
    uint64_t sums[PROBE_MAX_CHUNKS];
} ProbeJob;

/* Portable: eight 64-bit lanes (the compiler vectorizes them). */
static uint64_t sum_words(const uint64_t *w, int64_t i, int64_t end)
{
    uint64_t acc[8] = {0};
    int64_t j;
    for (; i + 8 <= end; i += 8)
        for (j = 0; j < 8; j++) acc[j] += w[i + j];
    for (; i < end; i++) acc[0] += w[i];
    return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

#if KH_HAVE_X86_SIMD
#include <immintrin.h>

/* AVX2: 128 bytes per iteration in four 32-byte lanes, the widest loads the kernels use. */
static __attribute__((target("avx2"))) uint64_t sum_words_avx2(const uint64_t *w, int64_t i,
                                                               int64_t end)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    uint64_t lanes[4];
    for (; i + 16 <= end; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(w + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(w + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(w + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(w + i + 12)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    _mm256_storeu_si256((__m256i *)lanes, a0);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + sum_words(w, i, end);
}
#endif

static void probe_chunk(void *ctx, int64_t chunk)
{
    ProbeJob *job = ctx;
    int64_t i = chunk * job->words_per_chunk, end = i + job->words_per_chunk;
    if (end > job->total_words) end = job->total_words;
#if KH_HAVE_X86_SIMD
    if (gemv_simd(-1) >= 1) {
        job->sums[chunk] = sum_words_avx2(job->words, i, end);
        return;
    }
#endif
    job->sums[chunk] = sum_words(job->words, i, end);
}

int read_probe(const uint8_t *buf, int64_t nbytes, int nthreads, uint64_t *checksum)
{
    ProbeJob job; /* 32 KiB of sums on the caller's stack: concurrent calls stay apart */
    int64_t chunks, c, chunk_bytes = PROBE_CHUNK;
    if (!buf || !checksum || nbytes <= 0 || nbytes % 8 || nthreads <= 0) return KH_EINVAL;
    while (nbytes / chunk_bytes >= PROBE_MAX_CHUNKS) chunk_bytes *= 2;
    job.words = (const uint64_t *)buf;
    job.words_per_chunk = chunk_bytes / 8;
    job.total_words = nbytes / 8;
    chunks = (job.total_words + job.words_per_chunk - 1) / job.words_per_chunk;
    kh_parallel(probe_chunk, &job, chunks, nthreads, 1);
    *checksum = 0;
    for (c = 0; c < chunks; c++) *checksum += job.sums[c];
    return KH_OK;
}
