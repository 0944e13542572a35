"""Packed INT4 weights: a handle validated once (`Int4Weight`) and the calls that take it,
the decode GEMVs (W4A16, W4A8) in passes of MAX_ROWS rows, the prefill GEMM, the routed
experts (one route per row, or `moe_grouped` for T tokens), `unpack`, and `tile_int4` (the
CPU's tiles in place)."""
from __future__ import annotations

from engined.helper.core import (MAX_ROWS, F32, _as_rows, _out, _workspace, check,
                                 default_threads, ffi, lib, require, torch)


class Int4Weight:
    """A packed INT4 weight, validated once, with the C pointers the kernels take.

    experts == 0: one linear, qweight [N, K/2], scales/mins [N, K/G].
    experts == E: a stack, qweight [E, N, K/2], scales/mins [E, N, K/G].
    mins None: symmetric (w = s*(q - 8)), passed to C as NULL.
    Holds its tensors and their storages, so the pointers stay valid while the handle lives,
    even if a tensor is given new storage (hugepages.gather_); `address` is (qweight, scales,
    mins) data addresses when prepared: a tensor that moved since needs a new handle."""

    __slots__ = ("q", "s", "m", "experts", "n", "k", "group", "work_floats", "q8_work_floats",
                 "address", "tiled", "_tensors")

    def __init__(self, qweight, scales, mins, group: int, tiled: bool = False):
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
        if tiled and (shape[-2] % int(lib.KH_TILE) or group % 32):
            raise ValueError(f"a linear in tiles needs N % {int(lib.KH_TILE)} == 0 and groups "
                             f"of whole blocks of 32, got qweight {shape}, group {group}")
        self.tiled = bool(tiled)
        self.n, self.k, self.group = shape[-2], 2 * shape[-1], group
        self.address = addresses(qweight, scales, mins)
        self.q = ffi.cast("uint8_t *", self.address[0])
        self.s = ffi.cast("uint16_t *", scales.data_ptr())
        self.m = ffi.NULL if mins is None else ffi.cast("uint16_t *", mins.data_ptr())
        self.work_floats = int(lib.gemv_w4a16_work_floats(MAX_ROWS, self.k, group))
        self.q8_work_floats = int(lib.gemv_w4a8_work_floats(MAX_ROWS, self.k, group))  # -1: refused
        self._tensors = tensors + tuple(t.untyped_storage() for t in tensors)


def addresses(qweight, scales, mins) -> tuple[int, int, int]:
    """The data addresses an Int4Weight's pointers were taken from (0: no mins)."""
    return tuple(0 if t is None else t.data_ptr() for t in (qweight, scales, mins))


def int4_weight(qweight, scales, mins, group: int, tiled: bool = False) -> Int4Weight:
    """Validate packed INT4 tensors (contiguous CPU uint8 codes, fp16 scales and mins; mins
    None for a symmetric linear; tiled: in the CPU's tiles, int4_format.to_tiles)."""
    require()
    return Int4Weight(qweight, scales, mins, group, tiled)


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


def tiles_w4a8(w: Int4Weight, x, out=None, threads: int = 1):
    """out[M, N] = q8(x)[M, K] @ W^T in fp32 for any M >= 1, W a linear in tiles: one call and
    one pass over W for decode rows, a verify step or a prefill chunk (csrc/kimi_tiles.c);
    each row's result is the same bits whatever rows come with it."""
    return _tiles(lib.tiles_w4a8, lib.tiles_w4a8_work_floats, "tiles_w4a8", w, x, out, threads)


def tiles_w4a16(w: Int4Weight, x, out=None, threads: int = 1):
    """tiles_w4a8 with x rounded to int16 per block of 32 instead (moe_grouped's W4A16
    rounding, csrc/kimi_tiles_i16.c): the Kimi-Linear model's INT4 linears on the CPU."""
    return _tiles(lib.tiles_w4a16, lib.tiles_w4a16_work_floats, "tiles_w4a16", w, x, out,
                  threads)


def _tiles(fn, sizer, what: str, w: Int4Weight, x, out, threads: int):
    if w.experts:
        raise ValueError(f"{what} takes one linear in tiles, not an expert stack")
    if not w.tiled:
        raise ValueError(f"{what} takes a linear in tiles (int4_format.to_tiles)")
    x = _as_rows(x, w.k)
    rows = x.shape[0]
    out = _out(out, (rows, w.n))
    _owner, work = _workspace(int(sizer(rows, w.k, w.group)))
    cast = ffi.cast
    status = fn(cast("float *", x.data_ptr()), rows, w.q, w.s, w.m, w.n, w.k, w.group, work,
                cast("float *", out.data_ptr()), threads)
    if status:
        check(status, what)
    return out


def _row_passes(fn, what: str, w: Int4Weight, x, out, work_floats: int, threads: int):
    """The dense GEMVs' launcher: x [M, K] in passes of MAX_ROWS rows -> out [M, N]."""
    k, n = w.k, w.n
    if w.experts:
        raise ValueError(f"{what} takes one linear, not an expert stack")
    _disk_layout(w, what)
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
    _disk_layout(w, "gemm_w4a16")
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
                out=None, threads: int = 1, w4a8: bool = False):
    """Routed SwiGLU experts of T tokens: x [T, D], experts [T, k] integer ids, weights [T, k]
    -> out [T, D] fp32, out[t] = sum_c weights[t, c] * (silu(x_t G_e^T) * (x_t U_e^T)) D_e^T.
    Each chosen expert is read once per call; an id out of range is KH_EINVAL. w4a8: x and h
    rounded to int8 per block of 32 and integer dots (moe_grouped_w4a8; group % 32 == 0).
    Without it, x and h are rounded to int16 per block where `moe_int16` says so (AVX2 and
    up: 2^-16 of a block's largest value), else met by the float kernels; on stacks in the
    CPU's tiles always (csrc/kimi_tiles_i16.c, every CPU)."""
    e, inner, d, group = gate.experts, gate.n, gate.k, gate.group
    op = "moe_grouped_w4a8" if w4a8 else "moe_grouped"
    if len({w.tiled for w in (gate, up, down)}) > 1:
        raise ValueError(f"{op}: the gate, up and down stacks must all be in the CPU's "
                         "tiles, or none")
    if (w4a8 or gate.tiled) and group % 32:
        raise ValueError(f"{op} needs a group size that is a multiple of 32"
                         f"{' on stacks in tiles' if not w4a8 else ''}, got {group}")
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
    bank = ffi.new("KhExperts *")
    for part, w in ((bank.gate, gate), (bank.up, up), (bank.down, down)):
        part.q, part.s, part.m, part.n, part.k, part.group = w.q, w.s, w.m, w.n, w.k, w.group
        part.tiled = int(w.tiled)
    bank.num_experts = e
    cast = ffi.cast
    what = "moe_grouped_w4a8" if w4a8 else "moe_grouped_w4a16"
    sizer = lib.moe_grouped_w4a8_work_floats if w4a8 else lib.moe_grouped_work_floats
    _owner, work = _workspace(sizer(tokens * top_k, d, inner, group))
    status = (lib.moe_grouped_w4a8 if w4a8 else lib.moe_grouped_w4a16)(
        bank, cast("float *", x.data_ptr()), tokens, top_k, cast("int64_t *", experts.data_ptr()),
        cast("float *", weights.data_ptr()), work, cast("float *", out.data_ptr()), threads)
    if status:
        check(status, what)
    return out


def _routed(fn, what, stacks, x, expert_ids, out, threads):
    """A bad expert id, or x rows neither 1 nor one per route, is KH_EINVAL from C."""
    w = stacks[0]
    if not w.experts or any((s.experts, s.n, s.k, s.group) != (w.experts, w.n, w.k, w.group)
                            for s in stacks):
        raise ValueError(f"{what}: expert stacks of one shape needed, got "
                         f"{[(s.experts, s.n, s.k, s.group) for s in stacks]}")
    for s in stacks:
        _disk_layout(s, what)
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


def _disk_layout(w: Int4Weight, what: str):
    """Only tiles_w4a8 and tiles_w4a16 (and moe_grouped, both dots, for stacks) read tiles:
    every other kernel would read garbage."""
    if w.tiled:
        raise ValueError(f"{what}: this linear is in the CPU's tiles (tiles_w4a8 or "
                         "tiles_w4a16 runs it)")


def unpack(w: Int4Weight, out=None, threads: int | None = None):
    """The dequantized weight, fp32 [N, K] (or [E, N, K] for a stack), into `out` if given."""
    _disk_layout(w, "unpack_int4")
    shape = (w.experts, w.n, w.k) if w.experts else (w.n, w.k)
    out = _out(out, shape)
    status = lib.unpack_int4(w.q, w.s, w.m, max(w.experts, 1) * w.n, w.k, w.group,
                             ffi.cast("float *", out.data_ptr()), int(threads or default_threads()))
    check(status, "unpack_int4")
    return out


def tile_int4(qweight, scales, mins, group: int, back: bool = False, threads: int | None = None):
    """Packed INT4 tensors (a linear [N, K/2] or a stack [E, N, K/2]) into the CPU's tiles in
    place, or back: int4_format.tile_tensors's layout (its reference), on the C pool."""
    w = Int4Weight(qweight, scales, mins, group)     # the checks; never tiled itself
    rows = max(w.experts, 1) * w.n
    status = lib.tile_int4(w.q, w.s, w.m, rows, w.k, group, int(back),
                           int(threads or default_threads()))
    if status == lib.KH_ENOMEM:     # malloc, not the cap; the weight is unchanged
        raise MemoryError("tile_int4: no memory for a copy of one tile per thread")
    check(status, "tile_int4")
