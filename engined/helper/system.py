"""Kernel selection (the SIMD caps), the pool's counters, the memory-read probe and the
process-wide memory cap (memcap_*)."""
from __future__ import annotations

from engined.helper.core import check, ffi, lib, require


SIMD_LEVELS = {0: "portable C", 1: "AVX2", 2: "AVX-512"}
# The integer-dot kernels (W4A8, the Q8_0 head): every level but 0 gives the same bits.
INT8_LEVELS = {0: "portable C", 1: "AVX2", 2: "AVX-VNNI", 3: "AVX-512 VNNI"}


def gemv_simd(level: int | None = None) -> int:
    """Cap the GEMV kernels at `level` (0 portable C, 1 AVX2, 2 AVX-512; None only asks).
    Returns the level in use, which is also capped by what this CPU has."""
    require()
    if level is not None and level not in SIMD_LEVELS:
        raise ValueError(f"SIMD level must be one of {sorted(SIMD_LEVELS)}, got {level}")
    return int(lib.gemv_simd(-1 if level is None else level))


def w4a8_simd(level: int | None = None) -> int:
    """Cap the integer-dot kernels of gemv_w4a8 and gemv_q8 at `level` (INT8_LEVELS: 3
    AVX-512 VNNI, the default, 2 AVX-VNNI, 1 AVX2, 0 portable C; None only asks). gemv_simd's
    caps 0 and 1 cap them too. Returns the level in use, also capped by what this CPU has."""
    require()
    if level is not None and level not in INT8_LEVELS:
        raise ValueError(f"integer-dot level must be one of {sorted(INT8_LEVELS)}, got {level}")
    return int(lib.w4a8_simd(-1 if level is None else level))


def moe_int16(d: int, inner: int, group: int) -> bool:
    """Whether moe_grouped (W4A16) rounds x and h to int16 per block of 32 and takes integer
    dots for experts of these shapes, under the current caps: w4a8_simd at AVX-512 VNNI, or
    at AVX2 where gemv_simd is below AVX-512 (an AVX-512 CPU without VNNI keeps its float
    kernels, the faster there); d and inner multiples of 64, a group a multiple of 32. Else
    it runs the float kernels."""
    require()
    return bool(lib.moe_grouped_w4a16_int16(d, inner, group))


def tiles_simd() -> int:
    """The W4A8 tile kernel (tiles_w4a8) under w4a8_simd's cap, as an INT8_LEVELS key: 3
    AVX-512 VNNI, 1 AVX2 (also where AVX-VNNI is the cap: no 256-bit VNNI tile kernel), 0
    portable C."""
    require()
    return int(lib.tiles_simd())


def tiles_amx(on: bool | None = None) -> bool:
    """Whether tiles_w4a8 runs calls of KH_AMX_MIN_ROWS (7) or more rows on Intel AMX, and
    tiles_q8 calls of KH_Q8_AMX_MIN_ROWS (6) or more, the same bits as tiles_simd's kernel:
    the CPU has AMX-INT8, Linux lent the tiles, tiles_simd is 3 (AVX-512 VNNI) and the switch
    is on. `on` sets the switch (on by default)."""
    require()
    return bool(lib.tiles_amx(-1 if on is None else int(on)))


def tiles_amx_calls() -> int:
    """tiles_w4a8 and tiles_q8 calls that ran on AMX since the process started (the tests'
    proof it ran)."""
    require()
    return int(lib.tiles_amx_calls())


def tiles_kernels() -> str:
    """The tile kernels (W4A8 projections, the Q8_0 head) under the current caps, for the log:
    "AVX-512 VNNI, AMX from 7 rows (the head from 6)", "AVX2", ..."""
    name = INT8_LEVELS[tiles_simd()]
    if not tiles_amx():
        return name
    return (f"{name}, AMX from {int(lib.KH_AMX_MIN_ROWS)} rows "
            f"(the head from {int(lib.KH_Q8_AMX_MIN_ROWS)})")


def attention_simd(head_dim: int) -> int:
    """The decode attention kernels llama_decode_layer runs for this head_dim, as a
    SIMD_LEVELS key: 2 AVX-512 (head_dim % 16 == 0), 1 AVX2 (% 8), 0 portable C; gemv_simd's
    cap caps them. AVX-512 gives the AVX2 kernels' bits."""
    require()
    return int(lib.attention_simd(head_dim))


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
