"""The one wrapper over the C helper: the only module that touches the cffi `lib` and `ffi`.

The compiled module is `engined._kimi_helper`, built from csrc/ by `_helper_build.py` at
install. As with bcrypt's wrapper, every C entry point has one Python function here that
validates its inputs, allocates or accepts the buffers and maps the status code to an
exception; the ops (engined/ops/*/cpu_c.py) and layers call these functions, never `lib`
(tests/ops/test_helper_boundary.py checks). Buffers are CPU torch tensors.

- `int4_weight` validates a packed INT4 weight (or a stack of experts; mins None for a
  symmetric one, format version 2) once and returns an `Int4Weight` holding its C pointers; the hot calls `gemv`, `grouped_gemv` and
  `moe_swiglu` (and `moe_grouped`, the multi-row MoE) take that handle, so a decode GEMV costs a few microseconds of Python.
  `gemv_w4a8` is `gemv` with x quantized to int8 per block of 32 (`w4a8_simd` says which kernel runs).
  `gemm` is the prefill GEMM (any row count, W decoded tile by tile, never whole).
  `gemv_f16` is the fp16 LM head, `gemv_q8` the Q8_0 one; `unpack` dequantizes a handle to fp32.
- `unpack_int4`, `gemv_w4a16`, `grouped_gemv_w4a16`, `moe_swiglu_w4a16`: the same kernels
  on numpy arrays, returning new arrays (the known-answer tests, and dequantizing).
- `MAX_ROWS` (KH_MAX_ROWS from C: rows of x one GEMV pass handles) and every workspace
  size come from the C side; nothing of the C layout is copied here.
- memcap_*: the process-wide reservation budget. What the kernel will grant (cgroup limit,
  RSS) is engine/memory.py's.
- `threads` counts the caller plus the helper's own pool threads (csrc/kimi_pool.c).
"""
from __future__ import annotations

import pathlib
import re
import sys
import threading

try:  # the GPU image has neither numpy nor cffi: importing this module must still work
    import numpy as np
    import torch
    from engined._kimi_helper import ffi, lib
except ImportError as exc:
    np = torch = ffi = lib = None
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None
    F32 = torch.float32


class HelperError(RuntimeError):
    """A C helper call returned a non-zero status."""


class MemoryCapExceeded(HelperError):
    """A reservation would exceed the configured memory cap."""


def available() -> bool:
    """True when the compiled C helper imported (the CPU kernels can run)."""
    return lib is not None


def require():
    """Raise a clear error if the C helper was not compiled."""
    if lib is None:
        raise HelperError(f"C helper not built ({_IMPORT_ERROR}); run `make setup`")


def check(status: int, what: str):
    """Map a C status code to an exception (KH_OK returns)."""
    if status == lib.KH_OK:
        return
    if status == lib.KH_ENOMEM:
        raise MemoryCapExceeded(f"{what}: memory cap exceeded")
    names = {lib.KH_EINVAL: "invalid argument", lib.KH_ESTATE: "invalid state"}
    raise HelperError(f"{what}: {names.get(status, f'status {status}')}")


def _header_max_rows() -> int:
    """KH_MAX_ROWS read from the C header, for a build without the compiled helper (the
    GPU image still plans decode batches by it)."""
    header = pathlib.Path(__file__).resolve().parent.parent / "csrc" / "kimi_helper.h"
    return int(re.search(r"#define KH_MAX_ROWS (\d+)", header.read_text()).group(1))


MAX_ROWS = int(lib.KH_MAX_ROWS) if lib is not None else _header_max_rows()
"""Rows of x one GEMV pass handles (KH_MAX_ROWS in csrc/kimi_helper.h): the one copy."""


def default_threads() -> int:
    """torch's thread count when torch is loaded (the engine's setting), else 1."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 1


# --- buffers: CPU torch tensors (the numpy conveniences below wrap theirs, no copy) -------

def _as_rows(x, k: int):
    """x: [M >= 1, k] any float on the CPU -> contiguous fp32 (a copy only when needed)."""
    if x.dim() != 2 or x.shape[1] != k or x.shape[0] < 1:
        raise ValueError(f"x must be [M, {k}], got {list(x.shape)}")
    if not x.is_cpu:
        raise ValueError(f"the C kernels need x on the CPU, got {x.device}")
    if x.dtype is not F32 or not x.is_contiguous():
        x = x.to(F32).contiguous()
    return x


def _out(out, shape: tuple):
    """A new fp32 buffer of `shape`, or `out` checked to be exactly that."""
    if out is None:
        return torch.empty(shape, dtype=F32)
    if out.shape != shape or out.dtype is not F32 or not out.is_contiguous() or not out.is_cpu:
        raise ValueError(f"out must be a contiguous CPU fp32 {list(shape)}, got "
                         f"{out.dtype} {list(out.shape)} on {out.device}")
    return out


_local = threading.local()


KEEP_WORKSPACE_FLOATS = 1 << 20
"""Scratch up to this size (4 MiB: any decode step's) stays with its thread between calls; a
prefill's larger scratch (moe_grouped: 33 MiB for 200 tokens of 8 routes at D = 2048) is
returned after its call, so the process does not keep its peak for good."""


def _workspace(nfloats: int):
    """(owner, float *) of a scratch buffer of at least `nfloats` fp32 (sizes come from C):
    the thread's cached buffer, or a one-off one that lives while the caller holds owner."""
    if nfloats < 0:
        raise HelperError("gemv_w4a16_work_floats: invalid argument")
    if nfloats > KEEP_WORKSPACE_FLOATS:
        buf = torch.empty(nfloats, dtype=F32)
        return buf, ffi.cast("float *", buf.data_ptr())
    local = _local.__dict__
    if local.get("size", 0) < nfloats:
        local["buf"] = torch.empty(max(nfloats, 1 << 16), dtype=F32)
        local["size"] = local["buf"].numel()
        local["ptr"] = ffi.cast("float *", local["buf"].data_ptr())
    return local["buf"], local["ptr"]


# --- packed INT4 weights ---------------------------------------------------------------

class Int4Weight:
    """A packed INT4 weight, validated once, with the C pointers the kernels take.

    experts == 0: one linear, qweight [N, K/2], scales/mins [N, K/G].
    experts == E: a stack, qweight [E, N, K/2], scales/mins [E, N, K/G].
    mins None: symmetric (w = s*(q - 8)), passed to C as NULL.
    Holds its tensors, so the pointers stay valid while the handle lives; `address` is
    qweight's data address when prepared (a tensor given new storage needs a new handle)."""

    __slots__ = ("q", "s", "m", "experts", "n", "k", "group", "work_floats", "q8_work_floats",
                 "address", "_tensors")

    def __init__(self, qweight, scales, mins, group: int):
        tensors = (qweight, scales) if mins is None else (qweight, scales, mins)
        shape = tuple(qweight.shape)
        if len(shape) not in (2, 3) or group <= 0 or (2 * shape[-1]) % group \
                or tuple(scales.shape) != shape[:-1] + (2 * shape[-1] // group,) \
                or (mins is not None and tuple(mins.shape) != tuple(scales.shape)):
            raise ValueError(f"bad INT4 shapes: qweight {shape}, scales {tuple(scales.shape)}, "
                             f"mins {None if mins is None else tuple(mins.shape)}, group {group}")
        if (qweight.dtype, scales.dtype) != (torch.uint8, torch.float16) \
                or (mins is not None and mins.dtype != torch.float16):
            raise ValueError("the C kernels need uint8 qweight and fp16 scales and mins")
        if not all(t.is_cpu for t in tensors):
            raise ValueError("the C kernels need the packed weight on the CPU")
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError("the C kernels need contiguous qweight, scales and mins")
        self.experts = shape[0] if len(shape) == 3 else 0
        self.n, self.k, self.group = shape[-2], 2 * shape[-1], group
        self.address = qweight.data_ptr()
        self.q = ffi.cast("uint8_t *", self.address)
        self.s = ffi.cast("uint16_t *", scales.data_ptr())
        self.m = ffi.NULL if mins is None else ffi.cast("uint16_t *", mins.data_ptr())
        self.work_floats = int(lib.gemv_w4a16_work_floats(MAX_ROWS, self.k, group))
        self.q8_work_floats = int(lib.gemv_w4a8_work_floats(MAX_ROWS, self.k, group))  # -1: refused
        self._tensors = tensors


def int4_weight(qweight, scales, mins, group: int) -> Int4Weight:
    """Validate packed INT4 tensors (contiguous CPU uint8 codes, fp16 scales and mins; mins
    None for a symmetric linear)."""
    require()
    return Int4Weight(qweight, scales, mins, group)


def gemv(w: Int4Weight, x, out=None, threads: int = 1):
    """out[M, N] = x[M, K] @ W^T in fp32, W one packed linear; x any float, M >= 1, run in
    passes of MAX_ROWS rows (each weight byte read once per pass). Returns out."""
    return _row_passes(lib.gemv_w4a16, "gemv_w4a16", w, x, out, w.work_floats, threads)


def gemv_w4a8(w: Int4Weight, x, out=None, threads: int = 1):
    """out[M, N] = q8(x)[M, K] @ W^T in fp32: as `gemv`, but each row of x is quantized to
    int8 per block of 32 (engined/ops/w4a8_gemv) and the dots are taken in integers. The
    group size must be a multiple of 32 (ValueError otherwise: fall back to `gemv`)."""
    if w.q8_work_floats < 0:
        raise ValueError(f"gemv_w4a8 needs a group size that is a multiple of 32, got {w.group}")
    return _row_passes(lib.gemv_w4a8, "gemv_w4a8", w, x, out, w.q8_work_floats, threads)


def _row_passes(fn, what: str, w: Int4Weight, x, out, work_floats: int, threads: int):
    """The dense GEMVs' launcher: x [M, K] in passes of MAX_ROWS rows -> out [M, N]."""
    k, n = w.k, w.n
    if w.experts:
        raise ValueError(f"{what} takes one linear, not an expert stack")
    x = _as_rows(x, k)
    rows = x.shape[0]
    out = _out(out, (rows, n))
    x_addr, out_addr = x.data_ptr(), out.data_ptr()
    (_owner, work), cast = _workspace(work_floats), ffi.cast
    for start in range(0, rows, MAX_ROWS):  # one pass when rows <= MAX_ROWS
        m = min(MAX_ROWS, rows - start)
        status = fn(cast("float *", x_addr + 4 * start * k), m, w.q, w.s, w.m, n, k, w.group,
                    work, cast("float *", out_addr + 4 * start * n), threads)
        if status:
            check(status, what)
    return out


def gemm(w: Int4Weight, x, out=None, threads: int = 1):
    """out[M, N] = x[M, K] @ W^T in fp32 for any M >= 1, W one packed linear: each thread
    decodes small tiles of W to fp32 and meets them with every row (csrc/kimi_gemm.c), so
    prefill never holds an [N, K] fp32 copy. Returns out."""
    if w.experts:
        raise ValueError("gemm_w4a16 takes one linear, not an expert stack")
    x = _as_rows(x, w.k)
    out = _out(out, (x.shape[0], w.n))
    cast = ffi.cast
    status = lib.gemm_w4a16(cast("float *", x.data_ptr()), x.shape[0], w.q, w.s, w.m, w.n, w.k,
                            w.group, cast("float *", out.data_ptr()), threads)
    if status:
        check(status, "gemm_w4a16")
    return out


def grouped_gemv(w: Int4Weight, x, expert_ids, out=None, threads: int = 1):
    """out[r] = x[r or 0] @ W[expert_ids[r]]^T; w an expert stack, x [1 or R, K], ids [R]."""
    return _routed(lib.grouped_gemv_w4a16, "grouped_gemv_w4a16", (w,), x, expert_ids, out,
                   threads)


def moe_swiglu(gate: Int4Weight, up: Int4Weight, x, expert_ids, out=None, threads: int = 1):
    """out[r] = silu(x_r @ G_e^T) * (x_r @ U_e^T), e = expert_ids[r]."""
    return _routed(lib.moe_swiglu_w4a16, "moe_swiglu_w4a16", (gate, up), x, expert_ids, out,
                   threads)


def moe_grouped(gate: Int4Weight, up: Int4Weight, down: Int4Weight, x, experts, weights,
                out=None, threads: int = 1):
    """Routed SwiGLU experts of T tokens: x [T, D], experts [T, k] integer ids, weights [T, k]
    -> out [T, D] fp32, out[t] = sum_c weights[t, c] * (silu(x_t G_e^T) * (x_t U_e^T)) D_e^T.
    Each chosen expert is read once per call; an id out of range is KH_EINVAL."""
    e, inner, d, group = gate.experts, gate.n, gate.k, gate.group
    if not e or (up.experts, up.n, up.k, up.group) != (e, inner, d, group) \
            or (down.experts, down.n, down.k, down.group) != (e, d, inner, group):
        raise ValueError(f"moe_grouped: gate/up [E, I, D] and down [E, D, I] stacks of one group "
                         f"needed, got {[(w.experts, w.n, w.k, w.group) for w in (gate, up, down)]}")
    x = _as_rows(x, d)
    tokens = x.shape[0]
    if experts.dim() != 2 or experts.shape[0] != tokens or weights.shape != experts.shape \
            or experts.is_floating_point() or not experts.is_cpu or not weights.is_cpu:
        raise ValueError(f"moe_grouped: experts (integer) and weights must be CPU [{tokens}, k], "
                         f"got {experts.dtype} {list(experts.shape)} and {list(weights.shape)}")
    experts = experts.to(torch.int64).contiguous()
    weights = weights.to(F32).contiguous()
    top_k = experts.shape[1]
    out = _out(out, (tokens, d))
    cast = ffi.cast
    _owner, work = _workspace(lib.moe_grouped_work_floats(tokens * top_k, d, inner, group))
    status = lib.moe_grouped_w4a16(
        cast("float *", x.data_ptr()), tokens, top_k, cast("int64_t *", experts.data_ptr()),
        cast("float *", weights.data_ptr()), e, gate.q, gate.s, gate.m, up.q, up.s, up.m,
        down.q, down.s, down.m, d, inner, group, work, cast("float *", out.data_ptr()), threads)
    if status:
        check(status, "moe_grouped_w4a16")
    return out


def _routed(fn, what, stacks, x, expert_ids, out, threads):
    """A bad expert id, or x rows neither 1 nor one per route, is KH_EINVAL from C."""
    w = stacks[0]
    if not w.experts or any((s.experts, s.n, s.k, s.group) != (w.experts, w.n, w.k, w.group)
                            for s in stacks):
        raise ValueError(f"{what}: expert stacks of one shape needed, got "
                         f"{[(s.experts, s.n, s.k, s.group) for s in stacks]}")
    x = _as_rows(x, w.k)
    if expert_ids.dim() != 1 or expert_ids.is_floating_point() or not expert_ids.is_cpu:
        raise ValueError(f"expert_ids must be a 1-D CPU integer tensor, got "
                         f"{expert_ids.dtype} {list(expert_ids.shape)} on {expert_ids.device}")
    if expert_ids.dtype is not torch.int64 or not expert_ids.is_contiguous():
        expert_ids = expert_ids.to(torch.int64).contiguous()
    routes, x_rows = expert_ids.shape[0], x.shape[0]
    out = _out(out, (routes, w.n))
    _owner, work = _workspace(lib.gemv_w4a16_work_floats(x_rows, w.k, w.group))
    weights = [p for s in stacks for p in (s.q, s.s, s.m)]
    cast = ffi.cast
    status = fn(cast("float *", x.data_ptr()), x_rows, cast("int64_t *", expert_ids.data_ptr()),
                routes, w.experts, *weights, w.n, w.k, w.group, work,
                cast("float *", out.data_ptr()), threads)
    if status:
        check(status, what)
    return out


def unpack(w: Int4Weight, out=None, threads: int | None = None):
    """The dequantized weight, fp32 [N, K] (or [E, N, K] for a stack), into `out` if given."""
    shape = (w.experts, w.n, w.k) if w.experts else (w.n, w.k)
    out = _out(out, shape)
    status = lib.unpack_int4(w.q, w.s, w.m, max(w.experts, 1) * w.n, w.k, w.group,
                             ffi.cast("float *", out.data_ptr()), int(threads or default_threads()))
    check(status, "unpack_int4")
    return out


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


# --- numpy conveniences: arrays in, new arrays out -------------------------------------

def _tensor(a, dtype):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))


def _packed_arrays(qweight, scales, mins, group) -> Int4Weight:
    return int4_weight(_tensor(qweight, np.uint8), _tensor(scales, np.float16),
                       None if mins is None else _tensor(mins, np.float16), group)


def unpack_int4(qweight, scales, mins, group: int, threads: int | None = None) -> np.ndarray:
    """Packed INT4 -> fp32. qweight: [N, K/2] uint8; scales, mins: [N, K/G] fp16 (mins None:
    symmetric) -> [N, K] fp32."""
    require()
    return unpack(_packed_arrays(qweight, scales, mins, group), None, threads).numpy()


def gemv_w4a16(x, qweight, scales, mins, group: int, threads: int = 1) -> np.ndarray:
    """y[M, N] = x[M, K] @ W^T, W packed INT4 (qweight [N, K/2], scales/mins [N, K/G]);
    1 <= M <= MAX_ROWS."""
    require()
    x = _tensor(x, np.float32)
    if x.dim() != 2 or x.shape[1] != 2 * np.shape(qweight)[-1]:
        raise ValueError(f"bad GEMV shapes: x {tuple(x.shape)}, qweight {np.shape(qweight)}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; gemv_w4a16 takes 1..{MAX_ROWS}")
    return gemv(_packed_arrays(qweight, scales, mins, group), x, None, int(threads)).numpy()


def grouped_gemv_w4a16(x, expert_ids, stack: tuple, group: int, threads: int = 1) -> np.ndarray:
    """out[r] = x[r or 0] @ W[expert_ids[r]]^T; stack = (qweight [E,N,K/2], scales, mins)."""
    return _routed_arrays(grouped_gemv, x, expert_ids, [stack], group, threads)


def moe_swiglu_w4a16(x, expert_ids, gate: tuple, up: tuple, group: int,
                     threads: int = 1) -> np.ndarray:
    """out[r] = silu(x_r @ G_e^T) * (x_r @ U_e^T), e = expert_ids[r]."""
    return _routed_arrays(moe_swiglu, x, expert_ids, [gate, up], group, threads)


def _routed_arrays(call, x, expert_ids, stacks, group, threads):
    require()
    for qweight, scales, mins in stacks:
        if np.ndim(qweight) != 3:
            raise ValueError(f"bad expert stack: qweight {np.shape(qweight)}, scales "
                             f"{np.shape(scales)}, group {group}")
    weights = [_packed_arrays(*stack, group) for stack in stacks]
    x, ids = _tensor(x, np.float32), _tensor(expert_ids, np.int64)
    return call(*weights, x, ids, None, int(threads)).numpy()


# --- kernel selection, pool counters, memory cap ---------------------------------------

SIMD_LEVELS = {0: "portable C", 1: "AVX2", 2: "AVX-512"}


def gemv_simd(level: int | None = None) -> int:
    """Cap the GEMV kernels at `level` (0 portable C, 1 AVX2, 2 AVX-512; None only asks).
    Returns the level in use, which is also capped by what this CPU has."""
    require()
    if level is not None and level not in SIMD_LEVELS:
        raise ValueError(f"SIMD level must be one of {sorted(SIMD_LEVELS)}, got {level}")
    return int(lib.gemv_simd(-1 if level is None else level))


def w4a8_simd() -> int:
    """The W4A8 kernel that runs under the current cap (SIMD_LEVELS key): 1 AVX2, also on
    AVX-512 machines until VNNI kernels exist, or 0 portable C."""
    require()
    return int(lib.w4a8_simd())


def read_probe(buf, threads: int = 1) -> int:
    """Read every byte of `buf` (a contiguous CPU tensor, nbytes a multiple of 8) with
    `threads` pool threads -> the sum of its 64-bit words mod 2**64. Timed, it is the memory
    read ceiling the GEMV benchmarks compare against."""
    require()
    if not buf.is_cpu or not buf.is_contiguous() or buf.nbytes % 8 or buf.data_ptr() % 8:
        raise ValueError("read_probe needs a contiguous, 8-byte aligned CPU tensor of 8k bytes")
    checksum = ffi.new("uint64_t *")
    check(lib.read_probe(ffi.cast("uint8_t *", buf.data_ptr()), buf.nbytes, threads, checksum),
          "read_probe")
    return int(checksum[0])


def pool_stats() -> tuple[int, int]:
    """(jobs handed to the worker pool, chunks its helper threads ran) since start."""
    require()
    jobs, chunks = ffi.new("int64_t *"), ffi.new("int64_t *")
    lib.pool_stats(jobs, chunks)
    return int(jobs[0]), int(chunks[0])


def memcap_init(cap_bytes: int):
    require()
    check(lib.memcap_init(int(cap_bytes)), "memcap_init")


def memcap_reserve(nbytes: int):
    require()
    check(lib.memcap_reserve(int(nbytes)), f"memcap_reserve({nbytes})")


def memcap_release(nbytes: int):
    require()
    check(lib.memcap_release(int(nbytes)), f"memcap_release({nbytes})")


def memcap_peak() -> int:
    require()
    return int(lib.memcap_peak())


def memcap_reserved() -> int:
    require()
    return int(lib.memcap_reserved())


def memcap_cap() -> int:
    require()
    return int(lib.memcap_cap())
