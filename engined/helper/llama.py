"""Llama decoder layers in C: `llama_layer` validates a layer once into a handle,
`llama_decode_layer` runs one layer (its own C call), and `llama_decode_layers` runs every
layer of a decode step in one C call (llama_decode_step), the step's arguments validated once."""
from __future__ import annotations

from engined.helper.core import (MAX_ROWS, _as_rows, _out, _workspace, check, ffi, lib,
                                 require, torch)
from engined.helper.int4 import Int4Weight


class LlamaLayerHandle:
    """A layer's C struct (KhLlamaLayer), validated once; holds what its pointers point into."""

    __slots__ = ("struct", "dim", "head_dim", "kv_heads", "work_floats", "_keep")

    def __init__(self, struct, dim: int, head_dim: int, kv_heads: int, keep: tuple):
        self.struct, self.dim, self.head_dim, self.kv_heads, self._keep = struct, dim, head_dim, kv_heads, keep
        self.work_floats = int(lib.llama_decode_layer_work_floats(struct, MAX_ROWS))  # any B


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
        part.tiled = int(w.tiled)
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
    hd] of this layer (k and v written at positions[b], attention over 0..positions[b]).
    llama_decode_layers over this one layer, through the C call of one layer."""
    require()
    h, cos, sin = _step_rows(h, cos, sin, len(kv), layer.dim, layer.head_dim)
    out = _out(out, tuple(h.shape))
    if out.data_ptr() != h.data_ptr():
        out.copy_(h)  # then in place on out: torch refuses an out that partly overlaps h
    if len(positions) != len(kv):
        raise ValueError(f"{len(kv)} caches and {len(positions)} positions must agree")
    pointers = [_cache_pointers(cache.unsqueeze(0), pos, b, layer) for b, (cache, pos)
                in enumerate(zip(kv, positions))]
    cast = ffi.cast
    keys = ffi.new("uint16_t *[]", [cast("uint16_t *", base) for base, _, _ in pointers])
    values = ffi.new("uint16_t *[]", [cast("uint16_t *", base + 2 * v_halves)
                                      for base, _, v_halves in pointers])
    _owner, work = _workspace(layer.work_floats)
    check(lib.llama_decode_layer(layer.struct, cast("float *", out.data_ptr()), len(kv),
                                 cast("float *", cos.data_ptr()), cast("float *", sin.data_ptr()),
                                 keys, values, ffi.new("int64_t[]", [int(p) for p in positions]),
                                 work, cast("float *", out.data_ptr()), threads),
          "llama_decode_layer")
    return out


def _step_rows(h, cos, sin, rows: int, dim: int, hd: int):
    h = _as_rows(h, dim)
    if not 1 <= h.shape[0] <= MAX_ROWS or h.shape[0] != rows:
        raise ValueError(f"{h.shape[0]} rows (1..{MAX_ROWS}), {rows} caches and positions must agree")
    cos, sin = (_as_rows(t, hd) for t in (cos, sin))
    if cos.shape[0] != rows or sin.shape[0] != rows:
        raise ValueError(f"cos and sin must be [{rows}, {hd}]")
    return h, cos, sin


def llama_decode_layers(layers: list[LlamaLayerHandle], h, cos, sin, caches, positions,
                        threads: int = 1, final_norm=None, final_eps: float = 0.0):
    """Every layer of one decode step, in order, layer i on layer i of every row's cache: h
    [B, D] fp32 updated in place and returned. caches: B whole fp16 caches [L, 2, S_max, KVH,
    hd] (L = len(layers)); cos, sin [B, hd]. The same computation as calling
    llama_decode_layer per layer with caches[b][i], in one C call: its per-layer checks and
    casts were ~29 us a layer, and the per-layer calls' pointers and transitions still ~60 us
    of a 2.7 ms SmolLM2 step at 1 row, ~170 us of 5.5 ms at 8 (verify steps). final_norm
    ([D] fp32, eps final_eps): the model's last norm in the same call, its result returned
    as a new [B, D] (h still updated)."""
    require()
    if not layers:
        if final_norm is not None:
            raise ValueError("a final norm needs the step's layers (none given)")
        return h
    first = layers[0]
    rows, hd, num_layers = len(caches), first.head_dim, len(layers)
    if len(positions) != rows:
        raise ValueError(f"{rows} caches and {len(positions)} positions must agree")
    if h.dtype is not torch.float32 or not h.is_contiguous():
        raise ValueError("h must be a contiguous fp32 [B, D]: it is updated in place")
    h, cos, sin = _step_rows(h, cos, sin, rows, first.dim, hd)
    if any((l.dim, l.head_dim, l.kv_heads) != (first.dim, hd, first.kv_heads) for l in layers):
        raise ValueError("the layers of one step must share D, head_dim and KV heads")
    pointers = [_cache_pointers(cache, pos, b, first, num_layers) for b, (cache, pos)
                in enumerate(zip(caches, positions))]
    _owner, work = _workspace(max(layer.work_floats for layer in layers))
    cast = ffi.cast
    failed = ffi.new("int64_t *")
    normed, norm_weight = ffi.NULL, ffi.NULL
    if final_norm is not None:
        if final_norm.dtype is not torch.float32 or not final_norm.is_cpu \
                or not final_norm.is_contiguous() or tuple(final_norm.shape) != (first.dim,):
            raise ValueError(f"final_norm must be a contiguous CPU fp32 [{first.dim}], got "
                             f"{final_norm.dtype} {list(final_norm.shape)}")
        out = torch.empty_like(h)
        normed, norm_weight = cast("float *", out.data_ptr()), cast("float *", final_norm.data_ptr())
    status = lib.llama_decode_step(
        ffi.new("KhLlamaLayer *[]", [layer.struct for layer in layers]), num_layers,
        cast("float *", h.data_ptr()), rows, cast("float *", cos.data_ptr()),
        cast("float *", sin.data_ptr()),
        ffi.new("uint16_t *[]", [cast("uint16_t *", base) for base, _, _ in pointers]),
        ffi.new("int64_t[]", [layer_halves for _, layer_halves, _ in pointers]),
        ffi.new("int64_t[]", [v_halves for _, _, v_halves in pointers]),
        ffi.new("int64_t[]", [int(p) for p in positions]), norm_weight, float(final_eps), normed,
        work, threads, failed)
    if status:
        check(status, f"llama_decode_layer (layer {failed[0]})" if failed[0] >= 0 else "llama_decode_step")
    return h if final_norm is None else out


def _cache_pointers(cache, pos, b: int, layer: LlamaLayerHandle, num_layers: int = 1):
    """Row b's whole cache [L, 2, S, KVH, hd] -> (address, halves from one layer's keys to the
    next's, halves from its keys to its values); ValueError unless it fits the layers and pos."""
    if cache.dtype is not torch.float16 or not cache.is_cpu or not cache.is_contiguous() \
            or cache.dim() != 5 or cache.shape[:2] != (num_layers, 2) \
            or cache.shape[3:] != (layer.kv_heads, layer.head_dim) or not 0 <= pos < cache.shape[2]:
        raise ValueError(f"row {b}: cache must be a contiguous CPU fp16 [{num_layers}, 2, S, "
                         f"{layer.kv_heads}, {layer.head_dim}] with position {pos} in 0..S-1, got "
                         f"{cache.dtype} {list(cache.shape)}")
    return cache.data_ptr(), cache.stride(0), cache.stride(1)
