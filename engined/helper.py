"""Thin wrapper over the C helper: validates inputs, allocates outputs, maps status codes.

The compiled module is `engined._kimi_helper` (built by `_helper_build.py` at install).
- unpack_int4, gemv_w4a16, grouped_gemv_w4a16, moe_swiglu_w4a16: numpy entry points with
  known-answer tests (the torch hot paths in engined/ops/*/cpu_c.py call `lib` directly);
  `threads` counts the caller plus the helper's own pool threads (csrc/kimi_pool.c).
- memcap_*: the process-wide reservation budget; effective_cap / current_rss: what the
  kernel will grant (cgroup limit) and what this process already holds (RSS).
"""
from __future__ import annotations

import os
import pathlib
import sys

try:  # the GPU image has neither numpy nor cffi: importing this module must still work
    import numpy as np
    from engined._kimi_helper import ffi, lib
except ImportError as exc:
    np = ffi = lib = None
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


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
    """Map a C status code to an exception (hot paths call `lib` directly, then this)."""
    if status == lib.KH_OK:
        return
    if status == lib.KH_ENOMEM:
        raise MemoryCapExceeded(f"{what}: memory cap exceeded")
    names = {lib.KH_EINVAL: "invalid argument", lib.KH_ESTATE: "invalid state"}
    raise HelperError(f"{what}: {names.get(status, f'status {status}')}")


def _ptr(array: np.ndarray, ctype: str):
    return ffi.cast(ctype, ffi.from_buffer(array))


def default_threads() -> int:
    """torch's thread count when torch is loaded (the engine's setting), else 1."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 1


def unpack_int4(qweight: np.ndarray, scales: np.ndarray, mins: np.ndarray, group: int,
                threads: int | None = None) -> np.ndarray:
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
                           _ptr(mins, "uint16_t *"), n, k, group, _ptr(out, "float *"),
                           int(threads or default_threads())),
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


def _expert_stack(qweight, scales, mins, group):
    qweight = np.ascontiguousarray(qweight, dtype=np.uint8)
    scales = np.ascontiguousarray(scales, dtype=np.float16)
    mins = np.ascontiguousarray(mins, dtype=np.float16)
    if qweight.ndim != 3 or group <= 0 or (2 * qweight.shape[2]) % group \
            or scales.shape != qweight.shape[:2] + (2 * qweight.shape[2] // group,) \
            or mins.shape != scales.shape:
        raise ValueError(f"bad expert stack: qweight {qweight.shape}, scales {scales.shape}, "
                         f"mins {mins.shape}, group {group}")
    return (_ptr(qweight, "uint8_t *"), _ptr(scales, "uint16_t *"), _ptr(mins, "uint16_t *"),
            qweight.shape, (qweight, scales, mins))


def grouped_gemv_w4a16(x: np.ndarray, expert_ids, stack: tuple, group: int,
                       threads: int = 1) -> np.ndarray:
    """out[r] = x[r or 0] @ W[expert_ids[r]]^T; stack = (qweight [E,N,K/2], scales, mins)."""
    return _routed("grouped_gemv_w4a16", x, expert_ids, [stack], group, threads)


def moe_swiglu_w4a16(x: np.ndarray, expert_ids, gate: tuple, up: tuple, group: int,
                     threads: int = 1) -> np.ndarray:
    """out[r] = silu(x_r @ G_e^T) * (x_r @ U_e^T), e = expert_ids[r]."""
    return _routed("moe_swiglu_w4a16", x, expert_ids, [gate, up], group, threads)


def _routed(name, x, expert_ids, stacks, group, threads):
    require()
    x = np.ascontiguousarray(x, dtype=np.float32)
    ids = np.ascontiguousarray(expert_ids, dtype=np.int64)
    parts = [_expert_stack(*st, group) for st in stacks]
    (e, n, half_k), k = parts[0][3], 2 * parts[0][3][2]
    if x.ndim != 2 or x.shape[1] != k or ids.ndim != 1 or any(p[3] != parts[0][3] for p in parts):
        raise ValueError(f"bad routed shapes: x {x.shape}, ids {ids.shape}, stacks "
                         f"{[p[3] for p in parts]}")
    work = np.empty(max(lib.gemv_w4a16_work_floats(x.shape[0], k, group), 1), dtype=np.float32)
    out = np.empty((ids.shape[0], n), dtype=np.float32)
    weights = [ptr for p in parts for ptr in p[:3]]
    check(getattr(lib, name)(_ptr(x, "float *"), x.shape[0], _ptr(ids, "int64_t *"), ids.shape[0],
                             e, *weights, n, k, group, _ptr(work, "float *"),
                             _ptr(out, "float *"), int(threads)), name)
    return out


SIMD_LEVELS = {0: "portable C", 1: "AVX2", 2: "AVX-512"}


def gemv_simd(level: int | None = None) -> int:
    """Cap the GEMV kernels at `level` (0 portable C, 1 AVX2, 2 AVX-512; None only asks).
    Returns the level in use, which is also capped by what this CPU has."""
    require()
    if level is not None and level not in SIMD_LEVELS:
        raise ValueError(f"SIMD level must be one of {sorted(SIMD_LEVELS)}, got {level}")
    return int(lib.gemv_simd(-1 if level is None else level))


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


# Memory the kernel will actually grant: the cgroup limit (v2 memory.max, v1
# memory.limit_in_bytes) and this process's resident set, so the engine can refuse
# a plan cleanly instead of being OOM-killed half-way through loading.
UNLIMITED_V1 = 1 << 60  # v1 reports "no limit" as a page-rounded 2**63 - 1


def _read_limit(path: pathlib.Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit() or int(text) >= UNLIMITED_V1:
        return None
    return int(text)


def cgroup_memory_limit(proc_cgroup: str = "/proc/self/cgroup",
                        cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors, or None."""
    root = pathlib.Path(cgroup_root)
    try:
        lines = pathlib.Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2 unified hierarchy
            base, leaf = root, "memory.max"
        elif "memory" in controllers.split(","):  # v1 memory controller
            base, leaf = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        rel = pathlib.PurePosixPath(path.strip() or "/")
        for parent in [rel, *rel.parents]:  # a namespaced mount shows only some levels
            limits.append(_read_limit(base / str(parent).lstrip("/") / leaf))
    found = [v for v in limits if v is not None]
    return min(found) if found else None


def effective_cap(requested_bytes: int, **roots) -> int:
    """min(requested, cgroup limit); requested 0 means "no cap of our own"."""
    limit = cgroup_memory_limit(**roots)
    if limit is None:
        return int(requested_bytes)
    return limit if requested_bytes <= 0 else min(int(requested_bytes), limit)


def current_rss(statm: str = "/proc/self/statm") -> int:
    """Resident set size of this process in bytes (0 where /proc is unavailable)."""
    try:
        resident_pages = int(pathlib.Path(statm).read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
