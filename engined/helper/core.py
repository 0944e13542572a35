"""What every part of the wrapper shares: the compiled module (or why it is missing), the
status codes mapped to exceptions, MAX_ROWS from C, and the fp32 buffers the calls take."""
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
    np = torch = ffi = lib = F32 = None
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
    header = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "kimi_helper.h"
    return int(re.search(r"#define KH_MAX_ROWS (\d+)", header.read_text()).group(1))


MAX_ROWS = int(lib.KH_MAX_ROWS) if lib is not None else _header_max_rows()
"""Rows of x one GEMV pass handles (KH_MAX_ROWS in csrc/kimi_helper.h): the one copy."""


def default_threads() -> int:
    """torch's thread count when torch is loaded (the engine's setting), else 1."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 1


# --- buffers: CPU torch tensors (the numpy conveniences in arrays.py wrap theirs, no copy) --

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
