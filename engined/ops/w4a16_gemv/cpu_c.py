"""w4a16_gemv on CPU through the C helper: fused unpack + dot on the helper's threads.

Each weight byte is read once per call for up to 8 rows of x (more rows run in
chunks of 8). Per-weight checks and cffi pointers are cached for the life of the
PackedInt4 object, so a call costs a few microseconds of Python.
"""
import contextlib
import threading
import weakref
from dataclasses import dataclass

import torch

from engined import helper
from engined.ops import int4_format, registry

_threads: int | None = None  # None: follow torch.get_num_threads()


def set_num_threads(n: int | None):
    """Threads for every cpu_c op; None follows torch.get_num_threads()."""
    global _threads
    if n is not None and n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    _threads = n


def num_threads() -> int:
    return _threads or torch.get_num_threads()


@contextlib.contextmanager
def torch_single_threaded():
    """Run torch ops on one thread while the cpu_c kernels keep num_threads(). A decode step's
    torch ops are tiny ([B, D] norms, one query's attention): a second OpenMP thread only adds
    wake-ups and fights the C helper's threads (SmolLM2-135M: 48 -> 57 tok/s on 2 cores)."""
    global _threads
    torch_threads, pinned = torch.get_num_threads(), _threads
    if torch_threads == 1:
        yield
        return
    _threads = num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(torch_threads)
        _threads = pinned


@dataclass(frozen=True)
class CWeight:
    """cffi pointers into a PackedInt4's (or a stack's) tensors, valid while it lives."""

    q: object
    s: object
    m: object
    n: int
    k: int
    group: int
    q_addr: int  # qweight.data_ptr() when cached: a tensor given new storage is re-read


_cache: dict[int, CWeight] = {}


def c_weight(w) -> CWeight:
    """Validate `w` once (CPU, contiguous, format dtypes) and cache its pointers."""
    found = _cache.get(id(w))
    if found is not None and found.q_addr == w.qweight.data_ptr():
        return found
    tensors = (w.qweight, w.scales, w.mins)
    if (w.qweight.dtype, w.scales.dtype, w.mins.dtype) != (torch.uint8, torch.float16, torch.float16):
        raise registry.KernelError("cpu_c kernels need uint8 qweight and fp16 scales and mins")
    if any(t.device.type != "cpu" for t in tensors):
        raise registry.KernelError("cpu_c kernels need the packed weight on the CPU")
    if not all(t.is_contiguous() for t in tensors):
        raise registry.KernelError("cpu_c kernels need contiguous qweight, scales and mins")
    helper.require()
    ffi = helper.ffi
    found = CWeight(ffi.cast("uint8_t *", w.qweight.data_ptr()),
                    ffi.cast("uint16_t *", w.scales.data_ptr()),
                    ffi.cast("uint16_t *", w.mins.data_ptr()),
                    w.qweight.shape[-2], w.qweight.shape[-1] * 2, w.group_size,
                    w.qweight.data_ptr())
    if id(w) not in _cache:
        weakref.finalize(w, _cache.pop, id(w), None)
    _cache[id(w)] = found
    return found


_local = threading.local()


def workspace(nfloats: int):
    """A per-thread scratch buffer of at least `nfloats` fp32, as a cffi pointer."""
    local = _local.__dict__
    if local.get("size", 0) < nfloats:
        local["buf"] = torch.empty(max(nfloats, 1 << 16), dtype=torch.float32)
        local["size"] = local["buf"].numel()
        local["ptr"] = helper.ffi.cast("float *", local["buf"].data_ptr())
    return local["ptr"]


def as_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x: [M, K] any float -> contiguous fp32 [M, K] on the CPU, or a clear error."""
    if x.dim() != 2 or x.shape[1] != k:
        raise registry.KernelError(f"x must be [M, {k}], got {list(x.shape)}")
    if x.device.type != "cpu":
        raise registry.KernelError(f"cpu_c kernels need x on the CPU, got {x.device}")
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    return x


def out_buffer(out: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.float32)
    if tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous() \
            or out.device.type != "cpu":
        raise registry.KernelError(f"out must be a contiguous CPU fp32 {list(shape)}, got "
                                   f"{out.dtype} {list(out.shape)} on {out.device}")
    return out


@registry.register("w4a16_gemv", "cpu_c", devices=("cpu",),
                   description="C helper: fused unpack+dot, one pass over W for up to 8 rows")
def w4a16_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """x: [M, K] -> [M, N] fp32, written into `out` when given (contiguous fp32 [M, N])."""
    cw = c_weight(w)
    x = as_rows(x, cw.k)
    rows = x.shape[0]
    out = out_buffer(out, (rows, cw.n))
    lib, cast, threads = helper.lib, helper.ffi.cast, num_threads()
    x_addr, out_addr = x.data_ptr(), out.data_ptr()
    for start in range(0, rows, helper.MAX_ROWS):  # one pass when rows <= 8
        m = min(helper.MAX_ROWS, rows - start)
        work = workspace(m * cw.k + m * (cw.k // cw.group))  # gemv_w4a16_work_floats
        status = lib.gemv_w4a16(cast("float *", x_addr + 4 * start * cw.k), m,
                                cw.q, cw.s, cw.m, cw.n, cw.k, cw.group, work,
                                cast("float *", out_addr + 4 * start * cw.n), threads)
        if status:
            helper.check(status, "gemv_w4a16")
    return out


registry.set_default("w4a16_gemv", "cpu", "cpu_c")
