/* kimi_kda.c: Kimi-Linear's KDA decode step on the CPU, from the layer's projections to the
 * o_proj input (engined/ops/kda_decode/reference.py is the plain form it equals):
 *
 *   per row r, head h, with the row's conv windows and state at its slot, updated in place:
 *   x_j = SiLU(sum_c window_j[c] * conv_w[j, c])  for the q, k, v channels of head h
 *   q, k = l2norm(q), l2norm(k);  g = -exp(A_log[h]) * softplus(f_a f_b^T + dt_bias)
 *   S <- exp(g) S;  S <- S + sigmoid(b) k (v - k S);  o = scale q S
 *   y = RMS_eps(o) * o_norm_w * sigmoid(g_a g_b^T)
 *
 * A row's state may be read from another slot than the one it is written to (a speculative
 * step's draft row starts from the row before it, in that row's slot): no copy first.
 * One pool task per (row, head): its channels, its K x V state and its outputs are its own,
 * so a row's result is the same operations whatever rows come with it and however many
 * threads run (what speculative decoding's verify rows need: they must equal lone steps bit
 * for bit). f_b and g_b come transposed, [K, W]: a head's K outputs are then contiguous
 * and the sums over K run as vector multiply-adds without reordering. */
#include "kimi_simd.h"

#include <math.h>
#include <string.h>

#define KH_KDA_MAX_DIM 256  /* head_dim (K == V) */
#define KH_KDA_MAX_TAPS 8   /* conv width */

typedef struct {
    const KhKda *a;
    const float *qkv, *low;
    const int64_t *slots, *src;          /* each row's state: read at src, written at slots */
    float *out;
} KdaJob;

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  /* torch's */

/* The conv of channel c of block j (q 0, k 1, v 2) with the new input x, from the window in
 * `from`; the moved window goes to `to` (the same window, or another slot's). */
static float conv_step(const KhKda *a, const float *from, float *to, int64_t j, int64_t c, float x)
{
    const int64_t width = a->heads * a->head_dim, taps = a->taps, at = (j * width + c) * (taps - 1);
    const float *w = a->conv_w + (j * width + c) * taps, *win = from + at;
    float acc = 0.0f;
    for (int64_t t = 0; t < taps - 1; t++)
        acc += win[t] * w[t];
    acc += x * w[taps - 1];
    for (int64_t t = 0; t + 1 < taps - 1; t++)
        to[at + t] = win[t + 1];
    if (taps > 1)
        to[at + taps - 2] = x;
    return silu(acc);
}

/* out[i] = sum_k x[k] * wt[k, first + i] for i < n: a head's slice of a [K, W] transposed. */
static void project(const float *x, const float *wt, int64_t kdim, int64_t width, int64_t first,
                    int64_t n, float *out)
{
    memset(out, 0, (size_t)n * sizeof(float));
    for (int64_t k = 0; k < kdim; k++) {
        const float xk = x[k], *row = wt + k * width + first;
        for (int64_t i = 0; i < n; i++)
            out[i] += xk * row[i];
    }
}

static void l2norm(float *x, int64_t n)
{
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

static void kda_task(void *ctx, int64_t task)
{
    const KdaJob *job = ctx;
    const KhKda *a = job->a;
    const int64_t heads = a->heads, d = a->head_dim, width = heads * d;
    const int64_t r = task / heads, h = task % heads, slot = job->slots[r];
    const int64_t src = job->src ? job->src[r] : slot;
    const float *qkv = job->qkv + r * 3 * width, *low = job->low + r * (2 * d + heads);
    const float *window = a->conv + src * 3 * width * (a->taps - 1);
    float *moved = a->conv + slot * 3 * width * (a->taps - 1);
    const float *S0 = a->S + (src * heads + h) * d * d;
    float *S = a->S + (slot * heads + h) * d * d;
    float q[KH_KDA_MAX_DIM], k[KH_KDA_MAX_DIM], v[KH_KDA_MAX_DIM], g[KH_KDA_MAX_DIM];
    float z[KH_KDA_MAX_DIM], pred[KH_KDA_MAX_DIM], o[KH_KDA_MAX_DIM];

    for (int64_t i = 0; i < d; i++) {
        const int64_t c = h * d + i;
        q[i] = conv_step(a, window, moved, 0, c, qkv[c]);
        k[i] = conv_step(a, window, moved, 1, c, qkv[width + c]);
        v[i] = conv_step(a, window, moved, 2, c, qkv[2 * width + c]);
    }
    l2norm(q, d);
    l2norm(k, d);
    project(low, a->f_bt, d, width, h * d, d, g);            /* f_a f_b^T, this head's K */
    project(low + d, a->g_bt, d, width, h * d, d, z);        /* g_a g_b^T */
    const float decay_scale = -expf(a->A_log[h]), beta = sigmoid(low[2 * d + h]);
    for (int64_t i = 0; i < d; i++)
        g[i] = expf(decay_scale * softplus(g[i] + a->dt_bias[h * d + i]));

    memset(pred, 0, (size_t)d * sizeof(float));
    for (int64_t i = 0; i < d; i++) {                        /* S <- exp(g) S; pred = k S */
        float *row = S + i * d;
        const float *row0 = S0 + i * d, gi = g[i], ki = k[i];
        for (int64_t j = 0; j < d; j++) {
            row[j] = row0[j] * gi;
            pred[j] += ki * row[j];
        }
    }
    for (int64_t j = 0; j < d; j++)
        pred[j] = v[j] - pred[j];
    memset(o, 0, (size_t)d * sizeof(float));
    for (int64_t i = 0; i < d; i++) {                        /* S += beta k (v - k S); o = q S */
        float *row = S + i * d;
        const float bk = beta * k[i], qi = q[i] * a->scale;
        for (int64_t j = 0; j < d; j++) {
            row[j] += bk * pred[j];
            o[j] += qi * row[j];
        }
    }
    float ss = 0.0f;
    for (int64_t j = 0; j < d; j++)
        ss += o[j] * o[j];
    const float inv = 1.0f / sqrtf(ss / (float)d + a->eps);
    float *y = job->out + r * width + h * d;
    for (int64_t j = 0; j < d; j++)
        y[j] = o[j] * inv * a->o_norm_w[j] * sigmoid(z[j]);
}

int kda_decode_rows(const KhKda *a, const float *qkv, const float *low, int64_t rows,
                    const int64_t *slots, const int64_t *src_slots, float *out, int nthreads)
{
    if (!a || !qkv || !low || !slots || !out || rows < 1 || a->heads < 1 || a->head_dim < 1 ||
        a->head_dim > KH_KDA_MAX_DIM || a->taps < 1 || a->taps > KH_KDA_MAX_TAPS ||
        !a->conv || !a->S || !a->conv_w || !a->f_bt || !a->g_bt || !a->A_log || !a->dt_bias ||
        !a->o_norm_w)
        return KH_EINVAL;
    for (int64_t r = 0; r < rows; r++) {
        if (slots[r] < 0 || slots[r] >= a->num_slots ||
            (src_slots && (src_slots[r] < 0 || src_slots[r] >= a->num_slots)))
            return KH_EINVAL;
        for (int64_t s = 0; s < rows; s++)  /* a row's tasks must be alone on what they touch */
            if (s != r && (slots[s] == slots[r] || (src_slots && src_slots[s] == slots[r])))
                return KH_EINVAL;
    }
    KdaJob job = {a, qkv, low, slots, src_slots, out};
    kh_parallel(kda_task, &job, rows * a->heads, nthreads, 1);
    return KH_OK;
}
