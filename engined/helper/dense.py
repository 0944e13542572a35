"""The 16-bit and Q8_0 GEMVs: the LM heads, and Kimi-Linear's kept projections."""
from __future__ import annotations

from engined.helper.core import (MAX_ROWS, _as_rows, _out, _workspace, check, ffi, lib,
                                 require, torch)


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


def tiles_q8(q, scales, x, out=None, threads: int = 1):
    """gemv_q8 with W in the CPU's tiles (ops/q8_gemv/reference.py, PackedQ8.in_tiles): q int8
    and scales fp16 of W's shapes, rearranged; any M in one call and one pass over W, each
    row's result the same bits whatever rows come with it."""
    require()
    v, d = q.shape
    if v % int(lib.KH_TILE) or d % 32 or q.dtype is not torch.int8 \
            or scales.dtype is not torch.float16 or tuple(scales.shape) != (v, d // 32) \
            or not (q.is_cpu and scales.is_cpu and q.is_contiguous() and scales.is_contiguous()):
        raise ValueError(f"tiles_q8 needs contiguous CPU int8 [V, D] and fp16 [V, D/32], V a "
                         f"multiple of {int(lib.KH_TILE)}, got {q.dtype} {list(q.shape)} and "
                         f"{scales.dtype} {list(scales.shape)}")
    x = _as_rows(x, d)
    rows = x.shape[0]
    out = _out(out, (rows, v))
    cast = ffi.cast
    _owner, work = _workspace(int(lib.tiles_q8_work_floats(rows, d)))
    status = lib.tiles_q8(cast("float *", x.data_ptr()), rows, cast("int8_t *", q.data_ptr()),
                          cast("uint16_t *", scales.data_ptr()), v, d, work,
                          cast("float *", out.data_ptr()), threads)
    if status:
        check(status, "tiles_q8")
    return out


def q8_embed(q, scales, tiles: bool, ids) -> "torch.Tensor":
    """Rows ids ([T] int64) of a Q8_0 table (q int8 [V, D], scales fp16 [V, D/32], in the
    CPU's tiles when `tiles`, as tiles_q8 takes them) as fp32 [T, D]: code * scale, exact."""
    require()
    v, d = q.shape
    if d % 32 or q.dtype is not torch.int8 or scales.dtype is not torch.float16 \
            or tuple(scales.shape) != (v, d // 32) or (tiles and v % int(lib.KH_TILE)) \
            or not (q.is_cpu and scales.is_cpu and q.is_contiguous() and scales.is_contiguous()):
        raise ValueError(f"q8_embed needs contiguous CPU int8 [V, D] and fp16 [V, D/32]"
                         f"{f', V a multiple of {int(lib.KH_TILE)}' if tiles else ''}, got "
                         f"{q.dtype} {list(q.shape)} and {scales.dtype} {list(scales.shape)}")
    if ids.dim() != 1 or not ids.is_cpu:
        raise ValueError(f"q8_embed needs token ids [T] on the CPU, got {list(ids.shape)} on {ids.device}")
    if ids.dtype is not torch.int64 or not ids.is_contiguous():
        ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), d, dtype=torch.float32)
    if not ids.numel():
        return out
    cast = ffi.cast
    status = lib.q8_embed(cast("int8_t *", q.data_ptr()), cast("uint16_t *", scales.data_ptr()),
                          int(bool(tiles)), v, d, cast("int64_t *", ids.data_ptr()), ids.numel(),
                          cast("float *", out.data_ptr()))
    if status:
        raise ValueError(f"q8_embed: a token id outside 0..{v - 1} in {ids.tolist()[:8]}, or a "
                         f"table of {list(q.shape)} it cannot take")
    return out


def q8_simd() -> int:
    """The Q8_0 head's kernel under the current caps: w4a8_simd's level (INT8_LEVELS)."""
    require()
    return int(lib.q8_simd())
