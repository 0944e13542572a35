/* kimi_pool.c: the GEMVs' persistent worker threads (POSIX threads, GCC atomics).
 *
 * Why not OpenMP: a team barrier waits for every thread. On a shared host a
 * spinning team cost 30 ms for a 0.8 ms GEMV when the second core was busy, and a
 * passive one added ~140 us per call to wake a sleeping thread. Here the caller
 * starts on the chunks at once and never waits for a helper that has not begun:
 * it waits only for chunks a helper has already claimed. Helpers spin briefly
 * after a job (back-to-back GEMVs find them awake), then sleep on a condition.
 * Waking a sleeping helper costs the caller ~15 us on this VM (a futex call and an
 * IPI), more than a small GEMV takes: small jobs run on the caller alone unless a
 * helper is still awake.
 *
 * A chunk is claimed with one compare-and-swap on the ticket, (generation, the job's chunk
 * count, the next chunk) in one word, so a helper that wakes late can never take a chunk of a
 * later job. The count is in the word, not read beside it: a helper that loaded the ticket of
 * a finished job, then read the next job's larger count, could claim a chunk past the finished
 * job's end in the instant before the next ticket was stored, and run it with the next job's
 * function: that chunk then counted toward the next job, whose caller could return while a
 * real chunk still ran on its stack frame (a general protection fault in a tile kernel's
 * store, seen in served decode). */
#include "kimi_simd.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#define KH_POOL_MAX 63              /* helper threads at most (a job uses nthreads-1) */
#define KH_IDLE_SPIN_NS 20000       /* helpers poll this long after a job, then sleep */

static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cond = PTHREAD_COND_INITIALIZER;
static int num_helpers;             /* threads started (under submit_lock) */
static int num_sleeping;            /* helpers blocked on wake_cond (under wake_lock) */
static uint32_t generation;         /* job number, published under wake_lock */
#define TICKET_BITS 20              /* chunk count and next chunk: 20 bits each */
#define TICKET_FIELD ((1u << TICKET_BITS) - 1)
#define TICKET_GEN_MASK 0xffffffu   /* the generation's low 24 bits, in the top of the word */
static uint64_t ticket;             /* generation << 40 | chunks << 20 | next unclaimed chunk */
static int64_t chunks_done;
static int64_t stat_jobs, stat_helper_chunks; /* pool_stats(); atomic */
static KhTask job_fn;               /* the fields below are stable while chunks remain */
static void *job_ctx;
static int job_helpers;

static void cpu_relax(void)
{
#if KH_HAVE_X86_SIMD
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int claim(uint32_t gen, int64_t *chunk)
{
    uint64_t seen = __atomic_load_n(&ticket, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t next = (int64_t)(seen & TICKET_FIELD);
        if ((uint32_t)(seen >> (2 * TICKET_BITS)) != (gen & TICKET_GEN_MASK)) return 0;
        if (next >= (int64_t)((seen >> TICKET_BITS) & TICKET_FIELD)) return 0;
        if (__atomic_compare_exchange_n(&ticket, &seen, seen + 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            *chunk = next;
            return 1;
        }
    }
}

static void run_chunks(uint32_t gen, int is_helper)
{
    int64_t chunk;
    while (claim(gen, &chunk)) {
        job_fn(job_ctx, chunk);
        if (is_helper) __atomic_add_fetch(&stat_helper_chunks, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&chunks_done, 1, __ATOMIC_RELEASE);
    }
}

void pool_stats(int64_t *jobs, int64_t *helper_chunks)
{
    *jobs = __atomic_load_n(&stat_jobs, __ATOMIC_RELAXED);
    *helper_chunks = __atomic_load_n(&stat_helper_chunks, __ATOMIC_RELAXED);
}

static uint32_t wait_for_job(uint32_t seen)
{
    uint32_t gen;
    int64_t start = now_ns();
    int polls = 0;
    while ((gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) == seen) {
        cpu_relax();
        if (++polls % 64 || now_ns() - start < KH_IDLE_SPIN_NS) continue;
        pthread_mutex_lock(&wake_lock);
        num_sleeping++;
        while ((gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) == seen)
            pthread_cond_wait(&wake_cond, &wake_lock);
        num_sleeping--;
        pthread_mutex_unlock(&wake_lock);
    }
    return gen;
}

static void *helper_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint32_t seen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    for (;;) {
        seen = wait_for_job(seen);
        if (id < __atomic_load_n(&job_helpers, __ATOMIC_RELAXED)) run_chunks(seen, 1);
    }
    return 0;
}

/* A forked child has none of the parent's threads, and a lock held by one of them
 * would stay held: start over with fresh locks and no helpers. */
static void reset_in_child(void)
{
    pthread_mutex_init(&submit_lock, 0);
    pthread_mutex_init(&wake_lock, 0);
    pthread_cond_init(&wake_cond, 0);
    num_helpers = 0;
    num_sleeping = 0;
}

static void start_helpers(int wanted)
{
    static int atfork_done;
    if (!atfork_done) atfork_done = pthread_atfork(0, 0, reset_in_child) == 0;
    if (wanted > KH_POOL_MAX) wanted = KH_POOL_MAX;
    while (num_helpers < wanted) {
        pthread_t thread;
        pthread_attr_t attr;
        int failed;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        failed = pthread_create(&thread, &attr, helper_main, (void *)(intptr_t)num_helpers);
        pthread_attr_destroy(&attr);
        if (failed) return; /* fewer helpers: the caller does their share */
        num_helpers++;
    }
}

static void run_serial(KhTask fn, void *ctx, int64_t nchunks)
{
    int64_t chunk;
    for (chunk = 0; chunk < nchunks; chunk++) fn(ctx, chunk);
}

void kh_parallel(KhTask fn, void *ctx, int64_t nchunks, int nthreads, int worth_waking)
{
    uint32_t gen;
    int64_t spins = 0;
    int all_asleep;
    if (nthreads <= 1 || nchunks <= 1 || nchunks > TICKET_FIELD) { /* the ticket's count */
        run_serial(fn, ctx, nchunks);
        return;
    }
    pthread_mutex_lock(&submit_lock);
    start_helpers(nthreads - 1);
    pthread_mutex_lock(&wake_lock);
    all_asleep = num_sleeping == num_helpers;
    pthread_mutex_unlock(&wake_lock);
    if (all_asleep && !worth_waking) { /* a wake-up costs more than this job */
        pthread_mutex_unlock(&submit_lock);
        run_serial(fn, ctx, nchunks);
        return;
    }
    job_fn = fn;
    job_ctx = ctx;
    __atomic_store_n(&job_helpers, nthreads - 1, __ATOMIC_RELAXED);
    __atomic_store_n(&chunks_done, 0, __ATOMIC_RELAXED);
    gen = generation + 1;
    __atomic_store_n(&ticket, (uint64_t)(gen & TICKET_GEN_MASK) << (2 * TICKET_BITS)
                     | (uint64_t)nchunks << TICKET_BITS, __ATOMIC_RELEASE);
    pthread_mutex_lock(&wake_lock);
    __atomic_store_n(&generation, gen, __ATOMIC_RELEASE);
    if (num_sleeping) pthread_cond_broadcast(&wake_cond); /* spinning helpers need no call */
    pthread_mutex_unlock(&wake_lock);
    __atomic_add_fetch(&stat_jobs, 1, __ATOMIC_RELAXED);
    run_chunks(gen, 0);
    while (__atomic_load_n(&chunks_done, __ATOMIC_ACQUIRE) < nchunks) { /* claimed, running */
        if (++spins % 256) cpu_relax();
        else sched_yield();
    }
    pthread_mutex_unlock(&submit_lock);
}

static __thread int wake_all; /* kh_wake_all(): this thread's jobs all wake sleeping helpers */

int kh_wake_all(int on)
{
    int was = wake_all;
    wake_all = on;
    return was;
}

typedef struct {
    KhRowsTask fn;
    void *ctx;
    int64_t total, per_chunk;
} SplitJob;

static void split_chunk(void *ctx, int64_t chunk)
{
    const SplitJob *job = ctx;
    int64_t begin = chunk * job->per_chunk, end = begin + job->per_chunk;
    job->fn(job->ctx, begin, end < job->total ? end : job->total);
}

void kh_parallel_split(KhRowsTask fn, void *ctx, int64_t total, int64_t per_chunk, int nthreads,
                       int worth_waking)
{
    SplitJob job = {fn, ctx, total, per_chunk};
    kh_parallel(split_chunk, &job, (total + per_chunk - 1) / per_chunk, nthreads, worth_waking);
}

void kh_parallel_rows(KhRowsTask fn, void *ctx, int64_t total, int64_t cost, int nthreads,
                      int64_t multiple)
{
    int64_t per_thread, per_chunk;
    if (cost < KH_SERIAL_BELOW) nthreads = 1;
    per_thread = (total + nthreads - 1) / nthreads;
    /* About 8 chunks a thread, so that a helper that starts late still finds work; 2 in a
     * layer call, whose helpers are awake from job to job: each chunk is a contended claim
     * and count, and with 8 a SmolLM2 decode layer spent ~14% of its time on them (6.3 ->
     * 5.4 ms for 30 layers, AMD EPYC Zen 2, 2 threads; 1 chunk a thread measured alike). */
    per_chunk = nthreads == 1 ? total : (per_thread + (wake_all ? 1 : 7)) / (wake_all ? 2 : 8);
    if (per_chunk < 8) per_chunk = 8;
    per_chunk += (multiple - per_chunk % multiple) % multiple;
    kh_parallel_split(fn, ctx, total, per_chunk, nthreads, cost >= KH_WAKE_WORTH || wake_all);
}
