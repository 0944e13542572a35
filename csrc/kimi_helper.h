/* kimi_helper: the engine's C helper. Plain C99, caller-allocated buffers,
 * int status codes (KH_OK on success). Declares exactly the exported API. */
#ifndef KIMI_HELPER_H
#define KIMI_HELPER_H

#include <stddef.h>
#include <stdint.h>

#define KH_OK 0
#define KH_EINVAL 1      /* bad argument: null pointer, zero or misaligned size */
#define KH_ENOMEM 2      /* a reservation would exceed the memory cap */
#define KH_ESTATE 3      /* release of more than is reserved, or use before init */

#define KH_MAX_ROWS 8    /* rows of x one gemv_w4a16 call handles (one pass over the weights) */

/* Packed INT4 -> fp32 (format version 2, engined/ops/README.md): w = s*q + m for an
 * asymmetric linear; a symmetric one passes mins = NULL and is w = s*(q - 8).
 * qweight: [n, k/2] uint8, element 2j in the low nibble, 2j+1 in the high one.
 * scales, mins: [n, k/group] IEEE half bits (mins may be NULL). out: [n, k] fp32.
 * Every kernel below takes mins = NULL the same way.
 * nthreads >= 1: the caller plus up to nthreads-1 pool threads. */
int unpack_int4(const uint8_t *qweight, const uint16_t *scales,
                const uint16_t *mins, int64_t n, int64_t k, int64_t group,
                float *out, int nthreads);

/* Dense W4A16 GEMV: out[r, i] = sum_k x[r, k] * w[i, k] for r < rows (1..KH_MAX_ROWS),
 * w = s*q + m as above. x: [rows, k] fp32; out: [rows, n] fp32.
 * work: caller buffer of gemv_w4a16_work_floats(rows, k, group) floats.
 * Each weight byte is read once for all rows; nthreads >= 1 threads: the caller
 * and pool threads that never make it wait for one that has not started. */
int64_t gemv_w4a16_work_floats(int64_t rows, int64_t k, int64_t group);
int gemv_w4a16(const float *x, int64_t rows, const uint8_t *qweight,
               const uint16_t *scales, const uint16_t *mins, int64_t n, int64_t k,
               int64_t group, float *work, float *out, int nthreads);

/* Dense W4A16 GEMM, for prefill: out[r, i] = sum_k x[r, k] * w[i, k] for any rows >= 1, w
 * as above (mins may be NULL). x: [rows, k] fp32; out: [rows, n] fp32; group: any even
 * divisor of k. Each thread decodes tiles of 16 weight rows x 256 inputs to fp32 on its own
 * stack, once per 256 rows of x, and multiplies them while they are in L1: no fp32 copy of W
 * and no work buffer. Each (r, i) is computed by the same operations whatever rows and
 * nthreads are (not the same as gemv_w4a16's: the sums run in another order). */
int gemm_w4a16(const float *x, int64_t rows, const uint8_t *qweight, const uint16_t *scales,
               const uint16_t *mins, int64_t n, int64_t k, int64_t group, float *out,
               int nthreads);

/* W4A8 GEMV: as gemv_w4a16, but each row of x is first quantized to int8 per block of 32
 * (d = max|x|/127, xq = x/d rounded half away from zero; kimi_w4a8.c) and the dot products
 * with the codes are taken in integers. group must be a multiple of 32 (else KH_EINVAL:
 * the caller falls back to gemv_w4a16). work: gemv_w4a8_work_floats(rows, k, group) floats
 * (-1 for a shape it refuses). */
int64_t gemv_w4a8_work_floats(int64_t rows, int64_t k, int64_t group);
int gemv_w4a8(const float *x, int64_t rows, const uint8_t *qweight, const uint16_t *scales,
              const uint16_t *mins, int64_t n, int64_t k, int64_t group, float *work,
              float *out, int nthreads);
/* The integer-dot kernels' cap (gemv_w4a8 and gemv_q8): 3 AVX-512 VNNI (the default),
 * 2 AVX-VNNI, 1 AVX2, 0 portable C; -1 only asks. gemv_simd's cap 0 or 1 caps them too.
 * Returns the level in use, capped by what the CPU has. Every level but 0 gives the same
 * bits; AVX2 runs shapes with k % 64 == 32 at levels 2 and 3. */
int w4a8_simd(int mode);

/* W4A8 on a linear stored in tiles (kimi_tiles.c, kimi_tiles.h): x quantized as gemv_w4a8
 * does, but in natural order, any rows >= 1 (decode, a verify step, prefill), one pass over W.
 * The codes and scales are rearranged per tile of KH_TILE output rows so that one vector holds
 * the same input of 16 rows (engined/ops/int4_format.py, to_tiles): tq [n/16, k/8, 16, 4]
 * bytes (byte i of row j, chunk c: codes of inputs 8c + i and 8c + 4 + i in its low and high
 * nibbles), ts and tm [n/16, k/group, 16] half bits (tm NULL: symmetric). n % 16 == 0, group a
 * multiple of 32. Each output is the same operations whatever rows, nthreads and the
 * instruction set (tiles_simd: 3 AVX-512 VNNI, 1 AVX2, 0 portable C; w4a8_simd's cap caps
 * it): a row's result does not depend on its batch. work: tiles_w4a8_work_floats floats. */
#define KH_TILE 16
int64_t tiles_w4a8_work_floats(int64_t rows, int64_t k, int64_t group);
int tiles_w4a8(const float *x, int64_t rows, const uint8_t *tq, const uint16_t *ts,
               const uint16_t *tm, int64_t n, int64_t k, int64_t group, float *work,
               float *out, int nthreads);
/* tiles_w4a8's W4A16 form (kimi_tiles_i16.c): x rounded to int16 per block of 32 (d =
 * max|x| / 32767, half away from zero, as moe_grouped_w4a16 rounds it) and exact integer
 * dots, any rows >= 1; the same bits from every tiles_simd level, batch and thread count.
 * work: tiles_w4a16_work_floats floats (-1: a refused shape; group a multiple of 32). */
int64_t tiles_w4a16_work_floats(int64_t rows, int64_t k, int64_t group);
int tiles_w4a16(const float *x, int64_t rows, const uint8_t *tq, const uint16_t *ts,
                const uint16_t *tm, int64_t n, int64_t k, int64_t group, float *work,
                float *out, int nthreads);
int tiles_simd(void);
/* An INT4 linear or expert stack (n rows in all) put into those tiles in place, or back
 * (back = 1), tile by tile on nthreads threads (kimi_tile_layout.c): q [n, k/2] codes, s and m
 * [n, k/group] half bits (m NULL: symmetric). n % 16 == 0, k % 8 == 0, group dividing k.
 * KH_ENOMEM here: no memory for nthreads copies of one tile (the weight left unchanged). */
int tile_int4(uint8_t *q, uint16_t *s, uint16_t *m, int64_t n, int64_t k, int64_t group,
              int back, int nthreads);
/* Whether tiles_w4a8 runs KH_AMX_MIN_ROWS or more rows of x on Intel AMX (kimi_tiles_amx.c:
 * the same bits), and tiles_q8 KH_Q8_AMX_MIN_ROWS or more: AMX-INT8 on the CPU, lent by
 * Linux, tiles_simd at 3 and the switch on. mode 1 or 0 sets the switch (on by default), -1
 * only asks. Below 7 rows AVX-512 VNNI is as fast or faster for the projections (a tile's
 * loads and stores cost more than the rows' vpdpbusd; 2-core Xeon, SmolLM2's layers: 5 rows
 * 6.4 against 6.8 ms a step, 8 rows 8.6 against 8.4). */
#define KH_AMX_MIN_ROWS 7
int tiles_amx(int mode);
int64_t tiles_amx_calls(void); /* tiles_w4a8 and tiles_q8 calls that ran AMX, since start */
/* The Q8_0 head in tiles (kimi_q8_tiles.c): as gemv_q8, any rows >= 1, with q [n/16, k/4, 16,
 * 4] int8 (byte i of row j, chunk c: the weight of input 4c + i) and scales [n/16, k/32, 16];
 * n % 16 == 0, k % 32 == 0. Per output: acc = fma(dot_b, s_b * d_b, acc) over the blocks in
 * order: the same bits from every level (tiles_simd), batch and thread count.
 * work: tiles_q8_work_floats(rows, k) floats. */
int64_t tiles_q8_work_floats(int64_t rows, int64_t k);
int tiles_q8(const float *x, int64_t rows, const int8_t *tq, const uint16_t *ts, int64_t n,
             int64_t k, float *work, float *out, int nthreads);
/* tiles_q8 runs calls of this many rows or more on AMX where tiles_w4a8 would (tiles_amx):
 * no nibbles to unpack, so it pays from fewer rows than KH_AMX_MIN_ROWS. */
#define KH_Q8_AMX_MIN_ROWS 6

/* Q8_0 GEMV, the tied LM head as the GGUF ships it: out[r, i] = sum_k xq[r, k] * d[r, k/32]
 * * qweight[i, k] * scales[i, k/32] for r < rows (1..KH_MAX_ROWS), x quantized per block of
 * 32 as gemv_w4a8 does (natural order); qweight [n, k] int8, scales [n, k/32] fp16 bits,
 * k a multiple of 32. work: gemv_q8_work_floats(rows, k) floats (-1 for a refused shape).
 * q8_simd() says which kernel runs: w4a8_simd(-1)'s level. */
int64_t gemv_q8_work_floats(int64_t rows, int64_t k);
int gemv_q8(const float *x, int64_t rows, const int8_t *qweight, const uint16_t *scales,
            int64_t n, int64_t k, float *work, float *out, int nthreads);
int q8_simd(void);
/* The embedding lookup of a Q8_0 tied embedding: out[r] = row ids[r] of W as fp32 (each weight
 * code * scale, exact in fp32), W as gemv_q8 takes it (tiles 0) or as tiles_q8 does (tiles 1:
 * n % 16 == 0). KH_EINVAL for an id outside 0..n-1. In C: the torch ops it replaces ran
 * cold after each decode step's layers (~90 us for one row of SmolLM2, ~20 us warm). */
int q8_embed(const int8_t *q, const uint16_t *s, int tiles, int64_t n, int64_t k,
             const int64_t *ids, int64_t rows, float *out);

/* MoE GEMVs for one token: route r multiplies x row (x_rows == 1 ? 0 : r) by expert
 * expert_ids[r] of a stack qweight [num_experts, n, k/2], scales/mins [num_experts,
 * n, k/group]; out: [routes, n] fp32. Expert ids outside 0..num_experts-1 are
 * KH_EINVAL. work: gemv_w4a16_work_floats(x_rows, k, group) floats. */
int grouped_gemv_w4a16(const float *x, int64_t x_rows, const int64_t *expert_ids,
                       int64_t routes, int64_t num_experts, const uint8_t *qweight,
                       const uint16_t *scales, const uint16_t *mins, int64_t n, int64_t k,
                       int64_t group, float *work, float *out, int nthreads);

/* Gate and up projections of the selected experts with the SwiGLU epilogue:
 * out[r, i] = silu(gate_r[i]) * up_r[i], gate and up stacks shaped as above. */
int moe_swiglu_w4a16(const float *x, int64_t x_rows, const int64_t *expert_ids,
                     int64_t routes, int64_t num_experts, const uint8_t *gate_q,
                     const uint16_t *gate_s, const uint16_t *gate_m, const uint8_t *up_q,
                     const uint16_t *up_s, const uint16_t *up_m, int64_t n, int64_t k,
                     int64_t group, float *work, float *out, int nthreads);

/* Kimi-Linear's KDA decode step between the projections and o_proj (kimi_kda.c), on a pool
 * of num_slots per-sequence states updated in place: conv windows [num_slots, 3, W, taps-1]
 * and states S [num_slots, heads, K, K], W = heads * K (head_dim). conv_w [3, W, taps];
 * f_bt, g_bt [K, W] (f_b, g_b transposed); A_log [heads]; dt_bias [W]; o_norm_w [K]. */
typedef struct {
    int64_t heads, head_dim, taps, num_slots;
    float *conv;
    float *S;
    const float *conv_w, *f_bt, *g_bt, *A_log, *dt_bias, *o_norm_w;
    float eps, scale;
} KhKda;

/* rows rows: qkv [rows, 3W] (q, k, v before the conv), low [rows, 2K + heads] (f_a, g_a,
 * b), each row's state read at src_slots[r] (NULL: at slots[r]) and written at slots[r]
 * (slots distinct, no row's source another row's slot, else KH_EINVAL) -> out [rows, W]
 * fp32. One pool task per (row, head): a row's result does not depend on the rows beside it
 * or on nthreads. head_dim <= 256, taps <= 8. */
int kda_decode_rows(const KhKda *a, const float *qkv, const float *low, int64_t rows,
                    const int64_t *slots, const int64_t *src_slots, float *out, int nthreads);

/* One packed INT4 linear [n, k] (mins NULL: symmetric), as the layer call takes it; tiled:
 * 1 when q, s, m are in tiles (tiles_w4a8 runs it; for expert stacks, moe_grouped_w4a8 and
 * moe_grouped_w4a16, which on tiles always rounds x and h to int16, every CPU). */
typedef struct {
    const uint8_t *q;
    const uint16_t *s;
    const uint16_t *m;
    int64_t n, k, group;
    int tiled;
} KhInt4;

/* A grouped MoE's SwiGLU experts, one group size: gate and up stacks [num_experts, inner,
 * d/2] (n = inner, k = d), down [num_experts, d, inner/2] (n = d, k = inner); scales/mins
 * [num_experts, n, k/group] as above. */
typedef struct {
    KhInt4 gate, up, down;
    int64_t num_experts;
} KhExperts;

/* Multi-row grouped MoE for T tokens with top_k picks each:
 * out[t] = sum_c weights[t, c] * (silu(x_t G_e^T) * (x_t U_e^T)) D_e^T, e = experts[t, c]
 * (the sum in choice order). x: [T, d] fp32; experts: [T, top_k] int64 in 0..num_experts-1;
 * weights: [T, top_k] fp32; out: [T, d] fp32. The routes are sorted by expert, so each
 * chosen expert's weights are read once for all the rows that chose it. work:
 * moe_grouped_work_floats(T * top_k, d, inner, group) floats, 8-byte aligned (64-byte
 * aligned for speed: each part of it starts on a cache line then). */
int64_t moe_grouped_work_floats(int64_t routes, int64_t d, int64_t inner, int64_t group);
/* 1 where moe_grouped_w4a16 on banks in the row layout rounds x and h to int16 per block of
 * 32 (d = max|x| / 32767, half away from zero; at most 2^-16 of a block's largest value off)
 * and takes integer dots: at w4a8_simd's level 3 (vpdpwssd, AVX-512 VNNI), or at 1 and 2
 * (vpmaddwd) where gemv_simd is below AVX-512; with d % 64 == inner % 64 == 0 and group % 32
 * == 0. 0 where it runs the float kernels. Either way a token's result does not depend on the
 * tokens batched with it. On banks in tiles (KhInt4.tiled, all three) it always rounds so
 * and takes the tiles' integer dots (kimi_tiles_i16.c: the same bits at every level; group %
 * 32 == 0, else KH_EINVAL). */
int moe_grouped_w4a16_int16(int64_t d, int64_t inner, int64_t group);
int moe_grouped_w4a16(const KhExperts *bank, const float *x, int64_t tokens, int64_t top_k,
                      const int64_t *experts, const float *weights, float *work, float *out,
                      int nthreads);

/* The same with W4A8 projections: each route's x row and each row of h quantized to int8 per
 * block of 32 as gemv_w4a8 quantizes, and integer dots (its kernels; w4a8_simd says which).
 * group must be a multiple of 32 (else KH_EINVAL). A token's result does not depend on the
 * tokens batched with it. work: moe_grouped_w4a8_work_floats(T * top_k, d, inner, group)
 * floats, 8-byte aligned, 64 for speed (-1 for a refused shape). */
int64_t moe_grouped_w4a8_work_floats(int64_t routes, int64_t d, int64_t inner, int64_t group);
int moe_grouped_w4a8(const KhExperts *bank, const float *x, int64_t tokens, int64_t top_k,
                     const int64_t *experts, const float *weights, float *work, float *out,
                     int nthreads);

/* Dense fp16-weight GEMV: out[r, i] = sum_j x[r, j] * w[i, j] for r < rows (>= 1),
 * accumulated in fp32. w: [n, k] IEEE half bits; x: [rows, k] fp32; out: [rows, n].
 * Each (r, i) is computed by the same operations whatever rows is, so a row's
 * result does not depend on the rows batched with it. */
int gemv_f16(const float *x, int64_t rows, const uint16_t *w, int64_t n, int64_t k,
             float *out, int nthreads);
/* The same with bfloat16 weights (the high 16 bits of an fp32); AVX2 or portable C. */
int gemv_bf16(const float *x, int64_t rows, const uint16_t *w, int64_t n, int64_t k,
              float *out, int nthreads);

/* One Llama decoder layer's weights (kimi_llama.c): fp32 norm weights [dim]; qkv
 * [(heads + 2 kv_heads) * head_dim, dim] (q rows, then k, then v), o [dim, heads * head_dim],
 * gate_up [2 inner, dim] (gate rows, then up), down [dim, inner]. w4a8: 1 runs the GEMVs as
 * gemv_w4a8 (every group a multiple of 32), 0 as gemv_w4a16. */
typedef struct {
    const float *attn_norm;
    const float *ffn_norm;
    float eps;
    KhInt4 qkv, o, gate_up, down;
    int64_t dim, heads, kv_heads, head_dim, inner;
    int w4a8;
} KhLlamaLayer;

/* One decode token for each of rows (1..KH_MAX_ROWS) sequences through the layer:
 * out [rows, dim] = h + attention + MLP, h [rows, dim] fp32 (out may be h). cos, sin
 * [rows, head_dim]: row r's rotary table at positions[r], sin's first half negated.
 * k_cache[r], v_cache[r]: row r's fp16 cache of this layer, [S_max, kv_heads, head_dim];
 * the token's k and v are written at positions[r] and attention runs over 0..positions[r].
 * work: llama_decode_layer_work_floats(layer, rows) floats (-1: a shape it refuses, e.g.
 * more than 16 query heads per KV head or head_dim over 256). */
int64_t llama_decode_layer_work_floats(const KhLlamaLayer *layer, int64_t rows);
int llama_decode_layer(const KhLlamaLayer *layer, const float *h, int64_t rows,
                       const float *cos, const float *sin, uint16_t *const *k_cache,
                       uint16_t *const *v_cache, const int64_t *positions, float *work,
                       float *out, int nthreads);

/* Every layer of one decode step, in order, on h [rows, dim] in place: layer i as
 * llama_decode_layer with row r's caches at cache[r] + i * layer_halves[r] (k) and that
 * + v_halves[r] (v), in halves: row r's whole cache [L, 2, S_max, kv_heads, head_dim] gives
 * layer_halves = 2 S_max kv_heads head_dim and v_halves = S_max kv_heads head_dim. work:
 * the largest llama_decode_layer_work_floats(layers[i], rows). It stops at the first layer
 * that fails: its status, and its index in *failed (-1 when none did; failed may be NULL).
 * final_norm (NULL: none): after the layers, normed [rows, dim] = the RMS norm of h (as the
 * layers' own norms) times final_norm [dim], eps final_eps. */
int llama_decode_step(const KhLlamaLayer *const *layers, int64_t num_layers, float *h,
                      int64_t rows, const float *cos, const float *sin, uint16_t *const *cache,
                      const int64_t *layer_halves, const int64_t *v_halves,
                      const int64_t *positions, const float *final_norm, float final_eps,
                      float *normed, float *work, int nthreads, int64_t *failed);

/* The decode attention kernels llama_decode_layer runs for this head_dim (kimi_attn.c): 2
 * AVX-512 (head_dim % 16 == 0), 1 AVX2 (% 8), 0 the portable C; gemv_simd's cap caps them. */
int attention_simd(int64_t head_dim);

/* Memory read-bandwidth probe: reads every byte of buf [nbytes, a multiple of 8, 8-byte
 * aligned] once with nthreads threads of the GEMVs' pool; *checksum gets the sum of its
 * 64-bit words (so the reads cannot be dropped). Time it to get the read ceiling. */
int read_probe(const uint8_t *buf, int64_t nbytes, int nthreads, uint64_t *checksum);

/* Counters of the worker pool: jobs handed to it (not run on the caller alone) and
 * chunks its helper threads ran. */
void pool_stats(int64_t *jobs, int64_t *helper_chunks);

/* The highest GEMV kernel allowed: 2 AVX-512 (the default), 1 AVX2+FMA+F16C, 0 the
 * portable C; -1 only asks. Returns the kernel in use (capped by what the CPU has). */
int gemv_simd(int mode);

/* Memory cap: one process-wide budget in bytes (0 = unlimited). */
int memcap_init(uint64_t cap_bytes);
int memcap_reserve(uint64_t nbytes);
int memcap_release(uint64_t nbytes);
uint64_t memcap_reserved(void);
uint64_t memcap_peak(void);
uint64_t memcap_cap(void);

#endif
