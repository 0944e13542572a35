"""Known-answer tests for the C helper (csrc/ + engined/helper/)."""
import numpy as np
import pytest
import torch

from engined import helper
from tests.support.simd import gemv_level_or_skip, level_ids

F16 = np.float16


@pytest.mark.parametrize("threads", [1, 3])
def test_unpack_int4_known_answer(threads):
    # one row, k=4, group 2: bytes 0x21 -> (1, 2), 0xF0 -> (0, 15)
    q = np.array([[0x21, 0xF0]], dtype=np.uint8)
    s = np.array([[0.5, 2.0]], dtype=F16)
    m = np.array([[-1.0, 0.25]], dtype=F16)
    out = helper.unpack_int4(q, s, m, group=2, threads=threads)
    assert out.tolist() == [[-0.5, 0.0, 0.25, 30.25]]


@pytest.mark.parametrize("threads", [1, 3])
def test_unpack_int4_symmetric_known_answer(threads):
    # no mins: w = s * (q - 8); bytes 0x21 -> (1, 2), 0xF0 -> (0, 15)
    q = np.array([[0x21, 0xF0]], dtype=np.uint8)
    s = np.array([[0.5, 2.0]], dtype=F16)
    out = helper.unpack_int4(q, s, None, group=2, threads=threads)
    assert out.tolist() == [[-3.5, -3.0, -16.0, 14.0]]


def test_unpack_int4_large_matrix_on_threads_matches_numpy():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 256, (700, 256), dtype=np.uint8)  # big enough to be split
    s = rng.standard_normal((700, 16)).astype(F16)
    m = rng.standard_normal((700, 16)).astype(F16)
    codes = np.stack([q & 15, q >> 4], axis=-1).reshape(700, 512).astype(np.float32)
    want = (codes.reshape(700, 16, 32) * s.astype(np.float32)[..., None]
            + m.astype(np.float32)[..., None]).reshape(700, 512)
    np.testing.assert_array_equal(helper.unpack_int4(q, s, m, 32, threads=2), want)


def test_unpack_int4_subnormal_and_negative_half():
    q = np.array([[0x30], [0x30]], dtype=np.uint8)  # codes (0, 3) in both rows
    s = np.array([[2.0 ** -24], [-(2.0 ** -14)]], dtype=F16)  # smallest subnormal, -min normal
    m = np.array([[0.0], [-3.5]], dtype=F16)
    assert helper.unpack_int4(q, s, m, group=2).tolist() == [
        [0.0, 3 * 2.0 ** -24], [-3.5, -3.5 - 3 * 2.0 ** -14]]


# Row 0: every code 1 (byte 0x11), s=1, m=0 -> y = sum(x).
# Row 1: codes 0..15, 0..15 (bytes 0x10, 0x32, ..., 0xFE twice), s=0.5, m=-2.
ROW1 = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] * 2
QW = np.array([[0x11] * 16, ROW1], dtype=np.uint8)
X = np.stack([np.ones(32), np.arange(32)]).astype(np.float32)
# x=ones:   row0 32,  row1 0.5*240 - 2*32 = 56
# x=0..31:  row0 496, row1 0.5*(1240 + 3160) - 2*496 = 1208
WANT = [[32.0, 56.0], [496.0, 1208.0]]


def _scales(group):
    g = 32 // group
    return (np.array([[1.0] * g, [0.5] * g], dtype=F16), np.array([[0.0] * g, [-2.0] * g], dtype=F16))


@pytest.mark.parametrize("group", [32, 16, 2])  # block kernel, scalar kernel, tiny groups
@pytest.mark.parametrize("threads", [1, 2])
def test_gemv_known_answer(group, threads):
    s, m = _scales(group)
    assert helper.gemv_w4a16(X, QW, s, m, group, threads).tolist() == WANT


# Symmetric (no mins), same codes: row 0 every code 1, s=1 -> -7 * sum(x);
# row 1 codes 0..15 twice, s=0.5 -> 0.5 * (dot(q, x) - 8 * sum(x)).
# x=ones:   row0 -224, row1 0.5*(240 - 256) = -8
# x=0..31:  row0 -3472, row1 0.5*(4400 - 3968) = 216
WANT_SYM = [[-224.0, -8.0], [-3472.0, 216.0]]


@pytest.mark.parametrize("group", [32, 16, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemv_symmetric_known_answer(group, threads):
    s, _ = _scales(group)
    assert helper.gemv_w4a16(X, QW, s, None, group, threads).tolist() == WANT_SYM


@pytest.fixture(params=sorted(helper.SIMD_LEVELS), ids=level_ids(helper.SIMD_LEVELS))
def simd_level(request):
    """Each kernel level this CPU has (the others skip, naming the one that ran)."""
    before = helper.gemv_simd()
    try:
        yield gemv_level_or_skip(request.param)
    finally:
        helper.gemv_simd(2)  # the default cap
    assert helper.gemv_simd() == before


def test_gemv_every_kernel_level_known_answer(simd_level):
    s, m = _scales(32)
    assert helper.gemv_w4a16(np.tile(X, (3, 1)), QW, s, m, 32).tolist() == WANT * 3
    assert helper.gemv_w4a16(np.tile(X, (3, 1)), QW, s, None, 32).tolist() == WANT_SYM * 3


def test_gemv_rows_are_independent_of_each_other():
    s, m = _scales(32)
    x = np.tile(X, (4, 1))  # 8 rows: the maximum in one pass
    assert helper.gemv_w4a16(x, QW, s, m, 32).tolist() == WANT * 4


@pytest.mark.parametrize("rows", [0, 9])
def test_gemv_refuses_row_counts_outside_one_to_eight(rows):
    s, m = _scales(32)
    with pytest.raises(ValueError, match="rows"):
        helper.gemv_w4a16(np.ones((rows, 32), np.float32), QW, s, m, 32)


def test_gemv_invalid_args_map_to_helper_error():
    s, m = _scales(32)
    with pytest.raises(helper.HelperError, match="invalid argument"):
        helper.gemv_w4a16(X, QW, s, m, 32, threads=0)
    q = np.zeros((2, 48), np.uint8)  # k=96 with odd group 3: shapes agree, C refuses
    with pytest.raises(helper.HelperError, match="invalid argument"):
        helper.gemv_w4a16(np.ones((1, 96), np.float32), q, np.ones((2, 32), F16),
                          np.ones((2, 32), F16), 3)
    with pytest.raises(ValueError, match="bad INT4 shapes"):
        helper.gemv_w4a16(X, QW, s[:, :0], m, 32)
    status = helper.lib.gemv_w4a16(helper.ffi.NULL, 1, helper.ffi.NULL, helper.ffi.NULL,
                                   helper.ffi.NULL, 2, 32, 32, helper.ffi.NULL,
                                   helper.ffi.NULL, 1)
    with pytest.raises(helper.HelperError, match="invalid argument"):
        helper.check(status, "gemv_w4a16")


def test_unpack_int4_invalid_shapes():
    with pytest.raises(ValueError, match="bad INT4 shapes"):
        helper.unpack_int4(np.zeros((1, 2), np.uint8), np.ones((1, 3), F16), np.ones((1, 3), F16), 2)


@pytest.fixture
def fresh_cap():
    yield
    helper.memcap_init(0)


def test_memcap_reserve_release_peak(fresh_cap):
    helper.memcap_init(100)
    helper.memcap_reserve(60)
    with pytest.raises(helper.MemoryCapExceeded):
        helper.memcap_reserve(50)
    assert helper.memcap_reserved() == 60
    helper.memcap_reserve(40)
    helper.memcap_release(70)
    assert (helper.memcap_reserved(), helper.memcap_peak()) == (30, 100)
    with pytest.raises(helper.HelperError, match="invalid state"):
        helper.memcap_release(31)
    helper.memcap_release(30)
    assert (helper.memcap_reserved(), helper.memcap_peak()) == (0, 100)


def test_memcap_zero_means_unlimited(fresh_cap):
    helper.memcap_init(0)
    helper.memcap_reserve(1 << 62)
    assert helper.memcap_reserved() == 1 << 62


# Two experts: expert 0 is (QW row 0, QW row 1), expert 1 the same rows swapped.
STACK_Q = np.stack([QW, QW[::-1]])
STACK_S = np.stack([_scales(32)[0], _scales(32)[0][::-1]])
STACK_M = np.stack([_scales(32)[1], _scales(32)[1][::-1]])


@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_and_swiglu_symmetric_known_answer(threads):
    x = X[:1] / 16  # ones/16: row0 = -7 * 2 = -14, row1 = 0.5*(240 - 256)/16 = -0.5
    sym = (STACK_Q, STACK_S, None)
    got = helper.grouped_gemv_w4a16(x, [1, 0], sym, 32, threads)
    assert got.tolist() == [[-0.5, -14.0], [-14.0, -0.5]]
    def silu(v):
        return v / (1.0 + np.exp(-v))
    np.testing.assert_allclose(helper.moe_swiglu_w4a16(x, [0], sym, sym, 32, threads),
                               [[silu(-14.0) * -14.0, silu(-0.5) * -0.5]], rtol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_gemv_known_answer(threads):
    stack = (STACK_Q, STACK_S, STACK_M)
    shared = helper.grouped_gemv_w4a16(X[:1], [1, 0, 1], stack, 32, threads)
    assert shared.tolist() == [[56.0, 32.0], [32.0, 56.0], [56.0, 32.0]]
    per_route = helper.grouped_gemv_w4a16(X, [0, 1], stack, 32, threads)
    assert per_route.tolist() == [[32.0, 56.0], [1208.0, 496.0]]


def test_moe_swiglu_known_answer():
    def silu(v):
        return v / (1.0 + np.exp(-v))
    stack = (STACK_Q, STACK_S, STACK_M)
    x = X[:1] / 16  # ones/16: row0 = 2, row1 = 0.5*240/16 - 2*2 = 3.5
    got = helper.moe_swiglu_w4a16(x, [0, 1], stack, stack, 32)
    want = [[silu(2.0) * 2.0, silu(3.5) * 3.5], [silu(3.5) * 3.5, silu(2.0) * 2.0]]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_routed_bad_expert_id_is_invalid_argument():
    with pytest.raises(helper.HelperError, match="invalid argument"):
        helper.grouped_gemv_w4a16(X[:1], [0, 2], (STACK_Q, STACK_S, STACK_M), 32)
    with pytest.raises(helper.HelperError, match="invalid argument"):
        helper.grouped_gemv_w4a16(X[:1], [-1], (STACK_Q, STACK_S, STACK_M), 32)


def test_prepared_handle_gemv_runs_more_than_max_rows_in_passes():
    import torch
    s, m = _scales(32)
    w = helper.int4_weight(torch.from_numpy(QW), torch.from_numpy(s), torch.from_numpy(m), 32)
    assert (w.experts, w.n, w.k, w.group) == (0, 2, 32, 32)
    assert w.work_floats == helper.lib.gemv_w4a16_work_floats(helper.MAX_ROWS, 32, 32)
    x = torch.from_numpy(np.tile(X, (helper.MAX_ROWS, 1)))  # 2 * MAX_ROWS rows: two passes
    out = torch.empty(2 * helper.MAX_ROWS, 2)
    assert helper.gemv(w, x, out, 2) is out
    assert out.tolist() == WANT * helper.MAX_ROWS
    with pytest.raises(ValueError, match=r"out must be a contiguous CPU fp32 \[16, 2\]"):
        helper.gemv(w, x, torch.empty(16, 3))
    with pytest.raises(ValueError, match=r"x must be \[M, 32\]"):
        helper.gemv(w, x[:, :16])
    with pytest.raises(ValueError, match="contiguous"):
        helper.int4_weight(torch.from_numpy(QW).t().contiguous().t(), torch.from_numpy(s),
                           torch.from_numpy(m), 32)


def test_unpack_of_an_expert_stack():
    import torch
    w = helper.int4_weight(*(torch.from_numpy(np.ascontiguousarray(a))
                             for a in (STACK_Q, STACK_S, STACK_M)), 32)
    got = helper.unpack(w)
    assert got.shape == (2, 2, 32)
    np.testing.assert_array_equal(got[1].numpy(), helper.unpack_int4(QW[::-1], STACK_S[1],
                                                                     STACK_M[1], 32))


def test_gemv_f16_known_answer_and_checks():
    import torch
    w = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.25]], dtype=torch.float16)
    x = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 4.0]])
    assert helper.gemv_f16(w, x, None, 2).tolist() == [[6.0, -0.25], [14.0, 2.0]]
    with pytest.raises(ValueError, match="fp16"):
        helper.gemv_f16(w.float(), x)
    with pytest.raises(helper.HelperError, match="invalid argument"):
        helper.gemv_f16(w, x, None, 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_read_probe_reads_every_word(threads):
    """The bandwidth probe's checksum is the sum of the buffer's 64-bit words (mod 2**64):
    every byte was read, at every SIMD level."""
    words = torch.randint(-2**62, 2**62, (3 * 2**18 + 5,), dtype=torch.int64, generator=torch.Generator().manual_seed(1))
    want = int(words.sum()) % 2**64
    try:
        for level in (0, 2):
            helper.gemv_simd(level)
            assert helper.read_probe(words, threads) == want
    finally:
        helper.gemv_simd(2)
    with pytest.raises(ValueError, match="8-byte aligned"):
        helper.read_probe(torch.zeros(12, dtype=torch.uint8), threads)
