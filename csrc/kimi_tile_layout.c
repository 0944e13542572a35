/* kimi_tile_layout.c: tile_int4 (kimi_helper.h), an INT4 linear or expert stack put into the
 * CPU's tiles in place, or back: engined/ops/int4_format.py's tile_tensors (the reference and
 * the definition of the layout) per tile of KH_TILE rows on the pool.
 *
 * Why: every routed bank of a Kimi model run by the CPU goes into tiles at load (W4A16 and
 * W4A8 alike); torch's permutes took 1.6 s per 302 MB bank on 2 threads, about two minutes
 * for the 48B's 78 banks. A tile's codes and scales take the same bytes in both layouts, so
 * each is rearranged through a copy of itself and nothing else moves. */
#include "kimi_helper.h"
#include "kimi_simd.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *q;
    uint16_t *s, *m;
    int64_t k, groups, bytes; /* bytes: one copy buffer (a tile's codes, or its scales) */
    int back, slots;
    uint8_t *buffers;         /* `slots` copy buffers, one per share running at once */
    int *taken;
} TileLayoutJob;

/* Tile at q (16 rows of k/2 bytes) through `was`, a copy of it. Into tiles: byte i of row
 * j, chunk c takes inputs 8c + i (low nibble) and 8c + 4 + i (high); on the disk row j's
 * byte 4c + m holds inputs 8c + 2m (low) and 8c + 2m + 1 (high). */
static void codes(uint8_t *q, const uint8_t *was, int64_t k, int back)
{
    int64_t half = k / 2, c;
    int j, i;
    for (c = 0; c < k / 8; c++)
        for (j = 0; j < KH_TILE; j++) {
            uint8_t *tile = (back ? (uint8_t *)was : q) + (c * KH_TILE + j) * 4;
            uint8_t *row = (back ? q : (uint8_t *)was) + j * half + 4 * c;
            uint8_t code[8];
            if (back) {
                for (i = 0; i < 4; i++) code[i] = tile[i] & 0x0f, code[4 + i] = tile[i] >> 4;
                for (i = 0; i < 4; i++) row[i] = (uint8_t)(code[2 * i] | code[2 * i + 1] << 4);
            } else {
                for (i = 0; i < 4; i++)
                    code[2 * i] = row[i] & 0x0f, code[2 * i + 1] = row[i] >> 4;
                for (i = 0; i < 4; i++) tile[i] = (uint8_t)(code[i] | code[4 + i] << 4);
            }
        }
}

/* [16, groups] <-> [groups, 16] half bits, through `was`. */
static void regroup(uint16_t *v, uint16_t *was, int64_t groups, int back)
{
    int64_t g;
    int j;
    memcpy(was, v, sizeof(uint16_t) * (size_t)(KH_TILE * groups));
    for (g = 0; g < groups; g++)
        for (j = 0; j < KH_TILE; j++) {
            if (back)
                v[j * groups + g] = was[g * KH_TILE + j];
            else
                v[g * KH_TILE + j] = was[j * groups + g];
        }
}

static void tile_share(void *ctx, int64_t begin, int64_t end)
{
    TileLayoutJob *job = ctx;
    int64_t code_bytes = KH_TILE * (job->k / 2), t;
    int slot = 0;
    uint8_t *was;
    /* a free buffer: at most `slots` shares run at once, so one is, or soon will be */
    while (__atomic_exchange_n(&job->taken[slot], 1, __ATOMIC_ACQUIRE))
        slot = (slot + 1) % job->slots;
    was = job->buffers + slot * job->bytes;
    for (t = begin; t < end; t++) {
        uint8_t *q = job->q + t * code_bytes;
        int64_t at = t * KH_TILE * job->groups;
        memcpy(was, q, (size_t)code_bytes);
        codes(q, was, job->k, job->back);
        regroup(job->s + at, (uint16_t *)was, job->groups, job->back);
        if (job->m) regroup(job->m + at, (uint16_t *)was, job->groups, job->back);
    }
    __atomic_store_n(&job->taken[slot], 0, __ATOMIC_RELEASE);
}

int tile_int4(uint8_t *q, uint16_t *s, uint16_t *m, int64_t n, int64_t k, int64_t group,
              int back, int nthreads)
{
    TileLayoutJob job = {q, s, m, k, 0, 0, back, nthreads, NULL, NULL};
    if (!q || !s || n <= 0 || n % KH_TILE || k <= 0 || k % 8 || group <= 0 || k % group
        || nthreads <= 0)
        return KH_EINVAL;
    job.groups = k / group;
    job.bytes = KH_TILE * (k / 2);
    if (job.bytes < KH_TILE * job.groups * 2) job.bytes = KH_TILE * job.groups * 2;
    job.bytes = (job.bytes + 63) / 64 * 64;
    /* every buffer before any tile changes: a refusal leaves the weight as it was */
    job.buffers = malloc((size_t)(job.bytes * nthreads));
    job.taken = calloc((size_t)nthreads, sizeof *job.taken);
    if (!job.buffers || !job.taken) {
        free(job.buffers);
        free(job.taken);
        return KH_ENOMEM;
    }
    kh_parallel_split(tile_share, &job, n / KH_TILE, 64, nthreads, 1);
    free(job.buffers);
    free(job.taken);
    return KH_OK;
}
