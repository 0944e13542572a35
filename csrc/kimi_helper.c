/* kimi_helper.c: see kimi_helper.h. Plain C99 + POSIX threads, no Python.h. */
#include "kimi_helper.h"
#include "kimi_simd.h"

#include <pthread.h>

typedef struct {
    const uint8_t *qweight;
    const uint16_t *scales, *mins;
    int64_t n, k, group;
    float *out;
} UnpackJob;

static void unpack_rows(void *ctx, int64_t row, int64_t end)
{
    const UnpackJob *job = ctx;
    int64_t k = job->k, group = job->group, groups = k / group, g, j;
    for (; row < end; row++) {
        for (g = 0; g < groups; g++) {
            const uint8_t *q = job->qweight + row * (k / 2) + g * (group / 2);
            float sc = kh_half_to_float(job->scales[row * groups + g]);
            float mn = job->mins ? kh_half_to_float(job->mins[row * groups + g])
                                 : KH_SYMMETRIC_MIN(sc);
            float *o = job->out + row * k + g * group;
            for (j = 0; j < group / 2; j++) {
                o[2 * j] = sc * (float)(q[j] & 0x0f) + mn;
                o[2 * j + 1] = sc * (float)(q[j] >> 4) + mn;
            }
        }
    }
}

int unpack_int4(const uint8_t *qweight, const uint16_t *scales,
                const uint16_t *mins, int64_t n, int64_t k, int64_t group,
                float *out, int nthreads)
{
    UnpackJob job = {qweight, scales, mins, n, k, group, out};
    if (!qweight || !scales || !out || nthreads <= 0) return KH_EINVAL;
    if (n <= 0 || k <= 0 || group <= 0 || group % 2 || k % group) return KH_EINVAL;
    /* prefill: whole matrices, many chunks */
    kh_parallel_split(unpack_rows, &job, n, n * k < (1 << 18) ? n : 16, nthreads,
                      n * k >= KH_WAKE_WORTH);
    return KH_OK;
}

static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cap_limit, cap_used, cap_peak;

int memcap_init(uint64_t cap_bytes)
{
    pthread_mutex_lock(&cap_lock);
    cap_limit = cap_bytes;
    cap_used = 0;
    cap_peak = 0;
    pthread_mutex_unlock(&cap_lock);
    return KH_OK;
}

int memcap_reserve(uint64_t nbytes)
{
    int status = KH_OK;
    pthread_mutex_lock(&cap_lock);
    if (cap_limit && (nbytes > cap_limit || cap_used > cap_limit - nbytes)) {
        status = KH_ENOMEM;
    } else {
        cap_used += nbytes;
        if (cap_used > cap_peak) cap_peak = cap_used;
    }
    pthread_mutex_unlock(&cap_lock);
    return status;
}

int memcap_release(uint64_t nbytes)
{
    int status = KH_OK;
    pthread_mutex_lock(&cap_lock);
    if (nbytes > cap_used) status = KH_ESTATE;
    else cap_used -= nbytes;
    pthread_mutex_unlock(&cap_lock);
    return status;
}

static uint64_t read_locked(const uint64_t *value)
{
    uint64_t v;
    pthread_mutex_lock(&cap_lock);
    v = *value;
    pthread_mutex_unlock(&cap_lock);
    return v;
}

uint64_t memcap_reserved(void) { return read_locked(&cap_used); }
uint64_t memcap_peak(void) { return read_locked(&cap_peak); }
uint64_t memcap_cap(void) { return read_locked(&cap_limit); }
