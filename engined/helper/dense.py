"""The 16-bit and Q8_0 GEMVs (the LM heads, Kimi-Linear's kept projections) and one Llama
decoder layer per call (`llama_layer` validates it once, `llama_decode_layer` runs it)."""
from __future__ import annotations

from engined.helper.core import (MAX_ROWS, _as_rows, _out, _workspace, check, ffi, lib,
                                 require, torch)
from engined.helper.int4 import Int4Weight


def gemv_f16(w, x, out=None, threads: int = 1):
    """out[M, V] = x[M, D] @ w^T, w fp16 [V, D], accumulated in fp32 (the LM head); each
    row's result does not depend on the rows batched with it."""
    return _gemv_h16(lib.gemv_f16 if lib else None, "gemv_f16", torch.float16, "fp16", w, x,
                     out, threads)


def gemv_bf16(w, x, out=None, threads: int = 1):
    """As gemv_f16 with w bfloat16 [N, D]: Kimi-Linear's kept projections and LM head on the
    CPU, read at 2 bytes a weight instead of being cast to fp32 on every call."""
    return _gemv_h16(lib.gemv_bf16 if lib else None, "gemv_bf16", torch.bfloat16, "bf16", w, x,
                     out, threads)


def _gemv_h16(fn, what: str, dtype, name: str, w, x, out, threads: int):
    require()
    if w.dim() != 2 or w.dtype is not dtype or not w.is_cpu or not w.is_contiguous():
        raise ValueError(f"w must be a contiguous CPU {name} [N, D], got {w.dtype} "
                         f"{list(w.shape)} on {w.device}")
    v, d = w.shape
    x = _as_rows(x, d)
    out = _out(out, (x.shape[0], v))
    cast = ffi.cast
    status = fn(cast("float *", x.data_ptr()), x.shape[0], cast("uint16_t *", w.data_ptr()), v, d,
                cast("float *", out.data_ptr()), threads)
    if status:
        check(status, what)
    return out


def gemv_q8(q, scales, x, out=None, threads: int = 1):
    """out[M, V] = q8(x)[M, D] @ W^T with W in GGUF's Q8_0: q int8 [V, D], scales fp16
    [V, D/32] (the LM head kept as shipped); x quantized per block of 32 as gemv_w4a8 does,
    dots in integers, in passes of MAX_ROWS rows. Each row's result is independent of the
    rows batched with it."""
    require()
    if q.dim() != 2 or q.dtype is not torch.int8 or not q.is_cpu or not q.is_contiguous():
        raise ValueError(f"q must be a contiguous CPU int8 [V, D], got {q.dtype} "
                         f"{list(q.shape)} on {q.device}")
    v, d = q.shape
    if d % 32 or scales.dtype is not torch.float16 or tuple(scales.shape) != (v, d // 32) \
            or not scales.is_cpu or not scales.is_contiguous():
        raise ValueError(f"scales must be a contiguous CPU fp16 [{v}, {d // 32}] (D a multiple "
                         f"of 32), got {scales.dtype} {list(scales.shape)}")
    x = _as_rows(x, d)
    rows = x.shape[0]
    out = _out(out, (rows, v))
    cast = ffi.cast
    owner, work = _workspace(int(lib.gemv_q8_work_floats(min(rows, MAX_ROWS), d)))
    wq, ws = cast("int8_t *", q.data_ptr()), cast("uint16_t *", scales.data_ptr())
    for start in range(0, rows, MAX_ROWS):
        m = min(MAX_ROWS, rows - start)
        status = lib.gemv_q8(cast("float *", x.data_ptr() + 4 * start * d), m, wq, ws, v, d,
                             work, cast("float *", out.data_ptr() + 4 * start * v), threads)
        if status:
            check(status, "gemv_q8")
    return out


def q8_simd() -> int:
    """The Q8_0 head's kernel under the current cap: 1 AVX2 (also on AVX-512 machines), or
    0 portable C."""
    require()
    return int(lib.q8_simd())


# --- one Llama decoder layer per call --------------------------------------------------

class LlamaLayerHandle:
    """A layer's C struct (KhLlamaLayer), validated once; holds what its pointers point into."""

    __slots__ = ("struct", "dim", "head_dim", "kv_heads", "_keep")

    def __init__(self, struct, dim: int, head_dim: int, kv_heads: int, keep: tuple):
        self.struct, self.dim, self.head_dim, self.kv_heads, self._keep = struct, dim, head_dim, kv_heads, keep


def llama_layer(attn_norm, ffn_norm, eps: float, qkv: Int4Weight, o: Int4Weight,
                gate_up: Int4Weight, down: Int4Weight, heads: int, kv_heads: int, head_dim: int,
                w4a8: bool) -> LlamaLayerHandle:
    """The layer handle llama_decode_layer takes: norm weights contiguous fp32 [D], the four
    packed linears' handles; ValueError for shapes the C call refuses."""
    require()
    norms = tuple(_as_rows(n.reshape(1, -1), n.numel()).reshape(-1) for n in (attn_norm, ffn_norm))
    if any(n.numel() != qkv.k for n in norms):
        raise ValueError(f"norm weights must be [{qkv.k}], got {[n.numel() for n in norms]}")
    layer = ffi.new("KhLlamaLayer *")
    layer.attn_norm, layer.ffn_norm = (ffi.cast("float *", n.data_ptr()) for n in norms)
    layer.eps = float(eps)
    for name, w in (("qkv", qkv), ("o", o), ("gate_up", gate_up), ("down", down)):
        if w.experts:
            raise ValueError(f"{name}: one linear needed, not an expert stack")
        part = getattr(layer, name)
        part.q, part.s, part.m, part.n, part.k, part.group = w.q, w.s, w.m, w.n, w.k, w.group
    layer.dim, layer.heads, layer.kv_heads, layer.head_dim = qkv.k, heads, kv_heads, head_dim
    layer.inner, layer.w4a8 = gate_up.n // 2, int(bool(w4a8))
    if lib.llama_decode_layer_work_floats(layer, 1) < 0:
        raise ValueError(f"a layer the C call refuses: D {qkv.k}, {heads} heads, {kv_heads} KV "
                         f"heads of {head_dim}, qkv {qkv.n}x{qkv.k}, o {o.n}x{o.k}, gate_up "
                         f"{gate_up.n}x{gate_up.k}, down {down.n}x{down.k}, groups "
                         f"{[w.group for w in (qkv, o, gate_up, down)]}, w4a8 {bool(w4a8)}")
    return LlamaLayerHandle(layer, qkv.k, head_dim, kv_heads, (norms, qkv, o, gate_up, down))


def llama_decode_layer(layer: LlamaLayerHandle, h, cos, sin, kv, positions, out=None,
                       threads: int = 1):
    """One decode token for each of B <= MAX_ROWS sequences through the layer: h [B, D] ->
    out [B, D] fp32 (out may be h). cos, sin: [B, hd] fp32; kv: B fp16 caches [2, S_max, KVH,
    hd] of this layer (k and v written at positions[b], attention over 0..positions[b])."""
    h = _as_rows(h, layer.dim)
    rows, hd = h.shape[0], layer.head_dim
    if rows > MAX_ROWS or len(kv) != rows or len(positions) != rows:
        raise ValueError(f"{rows} rows (1..{MAX_ROWS}), {len(kv)} caches and {len(positions)} "
                         f"positions must agree")
    cos, sin = (_as_rows(t, hd) for t in (cos, sin))
    if cos.shape[0] != rows or sin.shape[0] != rows:
        raise ValueError(f"cos and sin must be [{rows}, {hd}]")
    keys, values = ffi.new("uint16_t *[]", rows), ffi.new("uint16_t *[]", rows)
    for b, (cache, pos) in enumerate(zip(kv, positions)):
        if cache.dtype is not torch.float16 or not cache.is_cpu or not cache.is_contiguous() \
                or cache.dim() != 4 or cache.shape[0] != 2 or cache.shape[2:] != (layer.kv_heads, hd) \
                or not 0 <= pos < cache.shape[1]:
            raise ValueError(f"row {b}: cache must be a contiguous CPU fp16 [2, S, {layer.kv_heads}, "
                             f"{hd}] with position {pos} in 0..S-1, got {cache.dtype} "
                             f"{list(cache.shape)}")
        keys[b] = ffi.cast("uint16_t *", cache.data_ptr())
        values[b] = ffi.cast("uint16_t *", cache.data_ptr() + cache.stride(0) * 2)
    out = _out(out, (rows, layer.dim))
    _owner, work = _workspace(int(lib.llama_decode_layer_work_floats(layer.struct, rows)))
    cast = ffi.cast
    status = lib.llama_decode_layer(layer.struct, cast("float *", h.data_ptr()), rows,
                                    cast("float *", cos.data_ptr()), cast("float *", sin.data_ptr()),
                                    keys, values, ffi.new("int64_t[]", [int(p) for p in positions]),
                                    work, cast("float *", out.data_ptr()), threads)
    if status:
        check(status, "llama_decode_layer")
    return out
