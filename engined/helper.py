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


def check(status: int, what: str):
    """Map a C status code to an exception (hot paths call `lib` directly, then this)."""
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
    check(lib.unpack_int4(_ptr(qweight, "uint8_t *"), _ptr(scales, "uint16_t *"),
                           _ptr(mins, "uint16_t *"), n, k, group, _ptr(out, "float *")),
           "unpack_int4")
    return out


MAX_ROWS = 8  # rows of x one GEMV call handles (KH_MAX_ROWS in csrc/kimi_simd.h)


def gemv_w4a16(x: np.ndarray, qweight: np.ndarray, scales: np.ndarray, mins: np.ndarray,
               group: int, threads: int = 1) -> np.ndarray:
    """y[M, N] = x[M, K] @ W^T, W packed INT4 (qweight [N, K/2], scales/mins [N, K/G]); M <= 8."""
    require()
    x = np.ascontiguousarray(x, dtype=np.float32)
    qweight = np.ascontiguousarray(qweight, dtype=np.uint8)
    scales = np.ascontiguousarray(scales, dtype=np.float16)
    mins = np.ascontiguousarray(mins, dtype=np.float16)
    if x.ndim != 2 or qweight.ndim != 2 or x.shape[1] != 2 * qweight.shape[1]:
        raise ValueError(f"bad GEMV shapes: x {x.shape}, qweight {qweight.shape}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; gemv_w4a16 takes 1..{MAX_ROWS}")
    (rows, k), n = x.shape, qweight.shape[0]
    if group <= 0 or k % group or scales.shape != (n, k // group) or mins.shape != scales.shape:
        raise ValueError(f"bad INT4 shapes: qweight {qweight.shape}, scales {scales.shape}, "
                         f"mins {mins.shape}, group {group}")
    work = np.empty(lib.gemv_w4a16_work_floats(rows, k, group), dtype=np.float32)
    out = np.empty((rows, n), dtype=np.float32)
    check(lib.gemv_w4a16(_ptr(x, "float *"), rows, _ptr(qweight, "uint8_t *"),
                         _ptr(scales, "uint16_t *"), _ptr(mins, "uint16_t *"), n, k, group,
                         _ptr(work, "float *"), _ptr(out, "float *"), int(threads)),
          "gemv_w4a16")
    return out


def gemv_simd(enabled: bool | None = None) -> bool:
    """Allow (True) or forbid (False) the AVX2 GEMV kernels; returns whether they are used."""
    require()
    return bool(lib.gemv_simd(-1 if enabled is None else int(bool(enabled))))


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
