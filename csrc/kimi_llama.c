/* kimi_llama.c: one Llama decoder layer for up to KH_MAX_ROWS decode rows, in one call
 * (see kimi_helper.h). Per layer, Python used to run some 20 torch ops (norms, RoPE, the
 * fp16 cache cast to fp32, SDPA, SiLU, adds): about 10 of a 21 ms SmolLM2 step on 2 cores.
 * Here they are loops between the four GEMVs, which stay the helper's own: the norms, RoPE,
 * the residual adds and SiLU in kimi_act.c (AVX-512 where it runs, the same bits).
 *
 * Order, per row r (x = h[r], every vector fp32):
 *   a = rms_norm(x) * attn_norm;  [q | k | v] = a Wqkv^T;  q, k rotated (rotate-half)
 *   k, v stored at the row's position of its fp16 cache (round to nearest even);
 *   per head: softmax(q k_j / sqrt(hd)) over j <= position, times v_j (kimi_attn.c: online
 *   softmax over key ranges that the threads share; a KV group's heads share each key)
 *   x += att Wo^T;  f = rms_norm(x) * ffn_norm;  [g | u] = f Wgu^T;  x += (silu(g) * u) Wd^T
 * Memory traffic: the layer's INT4 weights once for all rows, plus each row's cache rows. */
#include "kimi_helper.h"
#include "kimi_simd.h"

#include <math.h>
#include <string.h>

/* fp32 -> IEEE half bits, round to nearest even (what torch's fp16 cast does). */
static uint16_t float_to_half(float f)
{
    uint32_t x, abs_bits, sign;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    abs_bits = x & 0x7fffffffu;
    if (abs_bits > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (abs_bits >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
    if (abs_bits < 0x38800000u) {                                   /* half subnormal or 0 */
        float a;
        memcpy(&a, &abs_bits, sizeof a);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); /* units of 2^-24 */
    }
    return (uint16_t)(sign | ((abs_bits + 0xfffu + ((abs_bits >> 13) & 1u) - 0x38000000u) >> 13));
}

/* out[i] = float_to_half(x[i]) for i < n: 8 at a time with F16C where the 8 are finite (its
 * round to nearest even is float_to_half's; a NaN's payload is not), else one at a time. */
#if KH_HAVE_X86_SIMD
static __attribute__((target("avx2,fma,f16c"))) int64_t to_halves_f16c(const float *x, int64_t n,
                                                                      uint16_t *out)
{
    const __m256 inf = _mm256_set1_ps(INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
        if (_mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ))) break; /* inf or NaN */
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    return i;
}
#endif

static void to_halves(const float *x, int64_t n, uint16_t *out)
{
    int64_t i = 0;
#if KH_HAVE_X86_SIMD
    if (gemv_simd(-1) >= 1) i = to_halves_f16c(x, n, out);
#endif
    for (; i < n; i++) out[i] = float_to_half(x[i]);
}

static int project(const KhLlamaLayer *L, const KhInt4 *w, const float *x, int64_t rows,
                   float *work, float *out, int nthreads)
{
    if (w->tiled)
        return tiles_w4a8(x, rows, w->q, w->s, w->m, w->n, w->k, w->group, work, out, nthreads);
    return (L->w4a8 ? gemv_w4a8 : gemv_w4a16)(x, rows, w->q, w->s, w->m, w->n, w->k, w->group,
                                             work, out, nthreads);
}

static int64_t gemv_work(const KhLlamaLayer *L, int64_t rows, int64_t k, int64_t group)
{
    return L->w4a8 ? gemv_w4a8_work_floats(rows, k, group) : gemv_w4a16_work_floats(rows, k, group);
}

int64_t llama_decode_layer_work_floats(const KhLlamaLayer *L, int64_t rows)
{
    int64_t d, qdim, most = 0, need, i;
    const KhInt4 *ws[4];
    if (!L || rows <= 0 || rows > KH_MAX_ROWS || L->heads <= 0 || L->kv_heads <= 0) return -1;
    d = L->dim;
    qdim = L->heads * L->head_dim;
    if (L->heads % L->kv_heads || L->heads / L->kv_heads > KH_ATTN_MAX_GROUP
        || L->head_dim <= 0 || L->head_dim % 2 || L->head_dim > KH_ATTN_MAX_DIM
        || L->qkv.n != qdim + 2 * L->kv_heads * L->head_dim || L->qkv.k != d || L->o.n != d
        || L->o.k != qdim || L->gate_up.n != 2 * L->inner || L->gate_up.k != d
        || L->down.n != d || L->down.k != L->inner)
        return -1;
    ws[0] = &L->qkv;
    ws[1] = &L->o;
    ws[2] = &L->gate_up;
    ws[3] = &L->down;
    for (i = 0; i < 4; i++) {
        if (!ws[i]->q || !ws[i]->s) return -1;
        if (ws[i]->tiled)
            need = ws[i]->n % KH_TILE ? -1 : tiles_w4a8_work_floats(rows, ws[i]->k, ws[i]->group);
        else
            need = gemv_work(L, rows, ws[i]->k, ws[i]->group);
        if (need < 0) return -1;
        most = need > most ? need : most;
    }
    /* normed x, qkv, att, down/o out, gate|up, act; then the GEMVs' and attention's work */
    need = kh_attention_work_floats(rows, L->heads, L->head_dim);
    most = need > most ? need : most;
    return rows * (d + L->qkv.n + qdim + d + 2 * L->inner + L->inner) + most;
}

static int decode_layer(const KhLlamaLayer *L, const float *h, int64_t rows, const float *cos,
                        const float *sin, uint16_t *const *k_cache, uint16_t *const *v_cache,
                        const int64_t *positions, float *work, float *out, int nthreads);

/* The layer's small GEMVs (q/k/v and o fall under KH_WAKE_WORTH alone) still wake the pool:
 * a layer is ~3.5M weights at SmolLM2's size, and with only the large ones waking it, 3 of
 * every 5 parallel steps ran on the caller alone. */
int llama_decode_layer(const KhLlamaLayer *L, const float *h, int64_t rows, const float *cos,
                       const float *sin, uint16_t *const *k_cache, uint16_t *const *v_cache,
                       const int64_t *positions, float *work, float *out, int nthreads)
{
    int was = kh_wake_all(1), status;
    status = decode_layer(L, h, rows, cos, sin, k_cache, v_cache, positions, work, out, nthreads);
    kh_wake_all(was);
    return status;
}

/* A decode step's layers in one call: per layer, Python built 2 cache pointers a row and
 * made the call (~30 us a step at 1 row, ~120 us at 8, on a 2-core Zen 5); the helpers also
 * stay awake from layer to layer. The model's final norm follows here too: torch's rms_norm,
 * run cold after the layers had swept the caches, took ~70 us a step (~12 us warm). */
int llama_decode_step(const KhLlamaLayer *const *layers, int64_t num_layers, float *h,
                      int64_t rows, const float *cos, const float *sin, uint16_t *const *cache,
                      const int64_t *layer_halves, const int64_t *v_halves,
                      const int64_t *positions, const float *final_norm, float final_eps,
                      float *normed, float *work, int nthreads, int64_t *failed)
{
    uint16_t *k_cache[KH_MAX_ROWS], *v_cache[KH_MAX_ROWS];
    int64_t i, r;
    int was, status = KH_OK;
    if (failed) *failed = -1;
    if (!layers || num_layers < 0 || rows < 1 || rows > KH_MAX_ROWS || !cache || !layer_halves
        || !v_halves || (final_norm && (!normed || num_layers == 0)))
        return KH_EINVAL;
    for (r = 0; r < rows; r++)
        if (!cache[r] || layer_halves[r] < 0 || v_halves[r] < 0) return KH_EINVAL;
    for (i = 1; i < num_layers; i++) /* the final norm is over layers[0]'s dim */
        if (layers[0] && layers[i] && layers[i]->dim != layers[0]->dim) return KH_EINVAL;
    was = kh_wake_all(1);
    for (i = 0; i < num_layers && status == KH_OK; i++) {
        for (r = 0; r < rows; r++) {
            k_cache[r] = cache[r] + i * layer_halves[r];
            v_cache[r] = k_cache[r] + v_halves[r];
        }
        status = layers[i] ? decode_layer(layers[i], h, rows, cos, sin, k_cache, v_cache,
                                          positions, work, h, nthreads)
                           : KH_EINVAL;
        if (status != KH_OK && failed) *failed = i;
    }
    kh_wake_all(was);
    if (status == KH_OK && final_norm && num_layers > 0)
        for (r = 0; r < rows; r++)
            kh_rms_norm(h + r * layers[0]->dim, final_norm, layers[0]->dim, final_eps,
                     normed + r * layers[0]->dim);
    return status;
}

static int decode_layer(const KhLlamaLayer *L, const float *h, int64_t rows, const float *cos,
                        const float *sin, uint16_t *const *k_cache, uint16_t *const *v_cache,
                        const int64_t *positions, float *work, float *out, int nthreads)
{
    int64_t d, hd, qdim, kvdim, inner, r;
    float *normed, *qkv, *att, *proj, *gate_up, *act, *gemv_space;
    KhAttention attn;
    int status;
    if (llama_decode_layer_work_floats(L, rows) < 0 || nthreads <= 0) return KH_EINVAL;
    if (!h || !cos || !sin || !k_cache || !v_cache || !positions || !work || !out) return KH_EINVAL;
    for (r = 0; r < rows; r++)
        if (positions[r] < 0 || !k_cache[r] || !v_cache[r]) return KH_EINVAL;
    d = L->dim, hd = L->head_dim, qdim = L->heads * hd, kvdim = L->kv_heads * hd, inner = L->inner;
    normed = work;                  /* [rows, d] */
    qkv = normed + rows * d;        /* [rows, qdim + 2 kvdim] */
    att = qkv + rows * L->qkv.n;    /* [rows, qdim] */
    proj = att + rows * qdim;       /* [rows, d] */
    gate_up = proj + rows * d;      /* [rows, 2 inner] */
    act = gate_up + rows * 2 * inner; /* [rows, inner] */
    gemv_space = act + rows * inner;

    if (out != h) memcpy(out, h, (size_t)(rows * d) * sizeof(float));
    for (r = 0; r < rows; r++) kh_rms_norm(out + r * d, L->attn_norm, d, L->eps, normed + r * d);
    if ((status = project(L, &L->qkv, normed, rows, gemv_space, qkv, nthreads))) return status;
    for (r = 0; r < rows; r++) {
        float *row = qkv + r * L->qkv.n;
        uint16_t *kc = k_cache[r] + positions[r] * kvdim, *vc = v_cache[r] + positions[r] * kvdim;
        kh_rope(row, L->heads + L->kv_heads, hd, cos + r * hd, sin + r * hd);
        to_halves(row + qdim, kvdim, kc);
        to_halves(row + qdim + kvdim, kvdim, vc);
    }
    attn.rows = rows;
    attn.heads = L->heads;
    attn.kv_heads = L->kv_heads;
    attn.head_dim = hd;
    attn.q_stride = L->qkv.n;
    attn.q = qkv;
    attn.k_cache = k_cache;
    attn.v_cache = v_cache;
    attn.positions = positions;
    attn.out = att;
    kh_attention(&attn, gemv_space, nthreads);
    if ((status = project(L, &L->o, att, rows, gemv_space, proj, nthreads))) return status;
    kh_add(out, proj, rows * d);
    for (r = 0; r < rows; r++) kh_rms_norm(out + r * d, L->ffn_norm, d, L->eps, normed + r * d);
    if ((status = project(L, &L->gate_up, normed, rows, gemv_space, gate_up, nthreads))) return status;
    for (r = 0; r < rows; r++)
        kh_silu_mul(gate_up + r * 2 * inner, gate_up + r * 2 * inner + inner, inner,
                    act + r * inner);
    if ((status = project(L, &L->down, act, rows, gemv_space, proj, nthreads))) return status;
    kh_add(out, proj, rows * d);
    return KH_OK;
}
