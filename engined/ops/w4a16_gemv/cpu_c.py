"""w4a16_gemv on CPU through the C helper: fused unpack + dot on the helper's threads.

Each weight byte is read once per call for up to helper.MAX_ROWS rows of x (more rows
run in passes of that many). The helper's validated weight handle (helper.Int4Weight) is
cached for the life of the PackedInt4 object, so a call costs a few microseconds of Python.
"""
import contextlib
import weakref

import torch

from engined import helper
from engined.ops import int4_format, registry
from engined.ops.torch_threads import one_torch_thread

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
    """Run torch ops on one thread while the cpu_c kernels keep num_threads()
    (SmolLM2-135M decode: 48 -> 57 tok/s on 2 cores; ops/torch_threads.py)."""
    global _threads
    pinned = _threads
    _threads = num_threads()
    try:
        with one_torch_thread():
            yield
    finally:
        _threads = pinned


_cache: dict[int, helper.Int4Weight] = {}


def c_weight(w) -> helper.Int4Weight:
    """The C helper's handle for `w` (a PackedInt4 or an expert stack), validated once and
    cached for the life of the object; a tensor of it given new storage is validated again."""
    found = _cache.get(id(w))
    if found is not None and found.address == helper.int4.addresses(w.qweight, w.scales, w.mins):
        return found
    if w.gpu_order:
        raise registry.KernelError("cpu_c kernels: these codes were repacked for the GPU kernels")
    helper.require()
    try:
        found = helper.int4_weight(w.qweight, w.scales, w.mins, w.group_size, w.tiles)
    except ValueError as exc:
        raise registry.KernelError(f"cpu_c kernels: {exc}") from None
    if id(w) not in _cache:
        weakref.finalize(w, _cache.pop, id(w), None)
    _cache[id(w)] = found
    return found


def launch(op: str, call, weights: tuple, *args, explain=None, **kwargs):
    """The cpu_c variants' one launcher: helper `call` on the C handles of `weights` (packed
    INT4 linears or expert stacks), then args, the thread count and kwargs. A weight or shape
    the helper refuses (ValueError) becomes a registry.KernelError naming op; on any refusal,
    `explain()`, when given, first raises a clearer error naming the bad input, if it can."""
    try:
        return call(*[c_weight(w) for w in weights], *args, num_threads(), **kwargs)
    except (ValueError, helper.HelperError) as exc:
        if explain is not None:
            explain()
        if isinstance(exc, ValueError):
            raise registry.KernelError(f"{op}: {exc}") from None
        raise


@registry.register("w4a16_gemv", "cpu_c", devices=("cpu",),
                   description="C helper: fused unpack+dot, one pass over W for up to 8 rows")
def w4a16_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """x: [M, K] -> [M, N] in x's dtype, written into `out` when given (contiguous [M, N]).
    The helper sums and writes fp32; another dtype (bf16 rows, rare on the CPU) is cast after."""
    wide = x.dtype == torch.float32
    y = launch("w4a16_gemv", helper.gemv, (w,), x, out if wide else None)
    if wide:
        return y
    return y.to(x.dtype) if out is None else out.copy_(y)


registry.set_default("w4a16_gemv", "cpu", "cpu_c")
