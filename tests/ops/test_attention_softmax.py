"""Decode attention's online-softmax pieces in the C helper (csrc/kimi_attn*.c), against plain
Python: the running maximum of a chunk's scores and the exps with their sum. The AVX-512
exps are checked through whole attention calls (test_llama_layer.py: the AVX2 bits)."""
import ctypes
import math
import struct

import pytest

import engined._kimi_helper
from engined import helper
from tests.support.simd import gemv_level_or_skip

LIB = ctypes.CDLL(engined._kimi_helper.__file__)


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def chains_max(s: list[float], m: float) -> float:
    """csrc/kimi_attn.h's kh_attn_max: 8 chains `m = s > m ? s : m` (chain l over s[8i + l]),
    the keys past the last whole 8 on chain 0, then chains 1..7 into chain 0 in turn."""
    part, whole = [m] * 8, len(s) // 8 * 8
    for j in range(whole):
        part[j % 8] = s[j] if s[j] > part[j % 8] else part[j % 8]
    for x in s[whole:]:
        part[0] = x if x > part[0] else part[0]
    for x in part[1:]:
        part[0] = x if x > part[0] else part[0]
    return part[0]


def same_bits(a: float, b: float) -> bool:
    return struct.pack("f", a) == struct.pack("f", b)


@pytest.fixture
def avx2():
    """Skips unless this CPU has AVX2 (the kernels are called directly); the cap is back after."""
    try:
        yield gemv_level_or_skip(1)
    finally:
        helper.gemv_simd(2)


CASES = [
    ([], -math.inf),
    ([1.5], -math.inf),
    ([0.25 * j - 3 for j in range(8)], -math.inf),
    ([math.sin(j) * 7 for j in range(64)], 2.0),
    ([math.cos(j) for j in range(37)], 5.0),                      # none beats m
    ([-0.0] * 9 + [0.0] * 9, -0.0),                               # which zero wins
    ([0.0] * 8, -0.0),                                            # m's zero: vmaxps(s, m),
    ([-0.0] * 8, 0.0),                                            # not vmaxps(m, s)
    ([0.0, -0.0] * 12 + [math.nan], -math.inf),                   # a NaN never wins
    ([math.nan] * 8 + [1.0, math.nan, -2.0], -math.inf),
    ([-math.inf] * 20, -math.inf),
    ([math.inf, 3.0] * 5, 0.0),
]


@pytest.mark.parametrize("scores,m", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_simd_running_max_is_the_chains_own(scores, m, avx2):
    """kh_attn_max_avx2 (one register of 8 chains) gives kh_attn_max's result, zero sign and
    NaNs included, and the plain one-chain maximum but for a zero's sign."""
    fn = LIB.kh_attn_max_avx2
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
    values = [f32(x) for x in scores]
    buf = (ctypes.c_float * max(1, len(values)))(*values)
    got = fn(ctypes.cast(buf, ctypes.c_void_p), len(values), m)
    want = chains_max(values, m)
    assert same_bits(got, want), (got, want)
    one_chain = m
    for x in values:
        one_chain = x if x > one_chain else one_chain
    assert got == one_chain or (math.isnan(got) and math.isnan(one_chain))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 15, 16, 17, 33, 64])
def test_the_exps_and_their_sum(n, avx2):
    """kh_attn_exp_sum_avx2 writes exp(s - m) in place (within 2 ulp of math.exp) and returns
    their sum in its order: the 8 lanes' chains, their tree, then the rest one at a time."""
    fn = LIB.kh_attn_exp_sum_avx2
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
    values = [f32(math.sin(3 * j) * 6 - 2) for j in range(n)]
    m = max(values, default=0.0)
    buf = (ctypes.c_float * max(1, n))(*values)
    total = fn(ctypes.cast(buf, ctypes.c_void_p), n, m)
    exps = list(buf)[:n]
    for got, x in zip(exps, values):
        assert abs(got - math.exp(f32(x - m))) <= 2 * 2.0 ** -23 * math.exp(x - m)
    whole, lanes = n // 8 * 8, [0.0] * 8
    for j in range(whole):
        lanes[j % 8] = f32(lanes[j % 8] + exps[j])
    pairs = [f32(lanes[i] + lanes[i + 4]) for i in range(4)]          # the 128-bit halves
    quads = [f32(pairs[0] + pairs[2]), f32(pairs[1] + pairs[3])]      # movehl
    want = f32(quads[0] + quads[1])                                   # movehdup
    for x in exps[whole:]:
        want = f32(want + x)
    assert same_bits(total, want), (total, want)
