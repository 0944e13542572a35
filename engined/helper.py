"""Thin wrapper over the C helper: validates inputs, allocates outputs, maps status codes.

The compiled module is `engined._kimi_helper` (built by `_helper_build.py` at install).
"""
import numpy as np

try:
    from engined._kimi_helper import ffi, lib
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    ffi = lib = None
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


class HelperError(RuntimeError):
    """A C helper call returned a non-zero status."""


class MemoryCapExceeded(HelperError):
    """A reservation would exceed the configured memory cap."""


def require():
    """Raise a clear error if the C helper was not compiled."""
    if lib is None:
        raise HelperError(f"C helper not built ({_IMPORT_ERROR}); run `make setup`")


def _check(status: int, what: str):
    if status == lib.KH_OK:
        return
    if status == lib.KH_ENOMEM:
        raise MemoryCapExceeded(f"{what}: memory cap exceeded")
    names = {lib.KH_EINVAL: "invalid argument", lib.KH_ESTATE: "invalid state"}
    raise HelperError(f"{what}: {names.get(status, f'status {status}')}")


def _ptr(array: np.ndarray, ctype: str):
    return ffi.cast(ctype, ffi.from_buffer(array))


def unpack_int4(qweight: np.ndarray, scales: np.ndarray, mins: np.ndarray, group: int) -> np.ndarray:
    """Packed INT4 -> fp32. qweight: [N, K/2] uint8; scales, mins: [N, K/G] fp16 -> [N, K] fp32."""
    require()
    qweight = np.ascontiguousarray(qweight, dtype=np.uint8)
    scales = np.ascontiguousarray(scales, dtype=np.float16)
    mins = np.ascontiguousarray(mins, dtype=np.float16)
    n, half_k = qweight.shape
    k = 2 * half_k
    if group <= 0 or k % group or scales.shape != (n, k // group) or mins.shape != scales.shape:
        raise ValueError(f"bad INT4 shapes: qweight {qweight.shape}, scales {scales.shape}, "
                         f"mins {mins.shape}, group {group}")
    out = np.empty((n, k), dtype=np.float32)
    _check(lib.unpack_int4(_ptr(qweight, "uint8_t *"), _ptr(scales, "uint16_t *"),
                           _ptr(mins, "uint16_t *"), n, k, group, _ptr(out, "float *")),
           "unpack_int4")
    return out


def memcap_init(cap_bytes: int):
    require()
    _check(lib.memcap_init(int(cap_bytes)), "memcap_init")


def memcap_reserve(nbytes: int):
    require()
    _check(lib.memcap_reserve(int(nbytes)), f"memcap_reserve({nbytes})")


def memcap_release(nbytes: int):
    require()
    _check(lib.memcap_release(int(nbytes)), f"memcap_release({nbytes})")


def memcap_peak() -> int:
    require()
    return int(lib.memcap_peak())


def memcap_reserved() -> int:
    require()
    return int(lib.memcap_reserved())
