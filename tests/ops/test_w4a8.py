"""w4a8_gemv beyond equivalence: the quantized integers bit for bit, every SIMD level, threads,
and how far W4A8 may sit from W4A16 (only the activation quantization error)."""
import pytest
import torch

from engined import helper
from engined.ops import registry
from engined.ops.int4_format import PackedInt4
from engined.ops.w4a16_gemv import cpu_c as w4a16_cpu_c
from engined.ops.w4a8_gemv import cpu_c, reference
from tests.ops.helpers import random_int4
from tests.support.simd import int8_levels, level_ids

LEVELS = helper.INT8_LEVELS


@pytest.fixture
def threads():
    yield
    w4a16_cpu_c.set_num_threads(None)


level = int8_levels()


def identity(k: int) -> PackedInt4:
    """W = I [k, k] (code 1 on the diagonal, scale 1, min 0): y = d * xq, exact in fp32."""
    qweight = torch.zeros(k, k // 2, dtype=torch.uint8)
    rows = torch.arange(k)
    qweight[rows, rows // 2] = torch.where(rows % 2 == 0, 0x01, 0x10).to(torch.uint8)
    scales = torch.ones(k, k // 32, dtype=torch.float16)
    return PackedInt4(qweight, scales, torch.zeros_like(scales), 32)


def awkward_x() -> torch.Tensor:
    """Blocks of 32: ties at d = 1, all zeros, subnormal (d = 0), huge, ordinary."""
    ties = torch.zeros(32)
    ties[:8] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5, 126.5, -126.5, 1.4999999])
    x = torch.stack([ties, torch.zeros(32), torch.full((32,), 1e-39),
                     torch.linspace(-3e30, 1e30, 32), torch.randn(32, generator=torch.Generator().manual_seed(0))])
    return x.reshape(1, -1).repeat(2, 1) * torch.tensor([[1.0], [-0.75]])  # [2, 160]


def test_rounding_is_half_away_from_zero():
    xq, d = reference.quantize_rows(awkward_x()[:1])
    assert d[0, 0] == 1.0 and d[0, 1] == 0.0 and d[0, 2] == 0.0
    assert xq[0, :8].tolist() == [127, 3, -3, 1, -1, 127, -127, 1]
    assert (xq[0, 32:96] == 0).all()


def test_c_quantizes_to_the_same_integers(level):
    """Through W = I every output is d * xq in fp32: equal bit for bit to the reference's."""
    x = awkward_x()
    xq, d = reference.quantize_rows(x)
    want = (xq.float().reshape(2, -1, 32) * d[..., None]).reshape(2, -1)
    assert torch.equal(cpu_c.w4a8_gemv(x, identity(x.shape[1])), want)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("group", [32, 64])
def test_every_kernel_level_matches_reference(level, rows, group, symmetric):
    gen = torch.Generator().manual_seed(rows + group)
    w = PackedInt4(group_size=group, **random_int4(gen, 300, 576, group, symmetric=symmetric))
    x = torch.randn(rows, 576, generator=gen)
    torch.testing.assert_close(cpu_c.w4a8_gemv(x, w), reference.w4a8_gemv(x, w),
                               atol=576e-6, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 5])  # 1: 4 weight rows per call (a short last group)
@pytest.mark.parametrize("n", [302, 1024])  # 1024 x 1024 wakes the pool (KH_WAKE_WORTH)
def test_thread_count_does_not_change_a_single_bit(threads, n, rows):
    w = PackedInt4(group_size=32, **random_int4(torch.Generator().manual_seed(1), n, 1024, 32))
    x = torch.randn(rows, 1024)
    w4a16_cpu_c.set_num_threads(1)
    one = cpu_c.w4a8_gemv(x, w)
    for count in (2, 3):
        w4a16_cpu_c.set_num_threads(count)
        assert torch.equal(cpu_c.w4a8_gemv(x, w), one)


@pytest.mark.parametrize("symmetric", [False, True])
def test_w4a8_differs_from_w4a16_only_by_the_activation_rounding(symmetric):
    """|y8 - y16| = |(x8 - x) . w| <= sum_k |x8 - x|_k |w_k|, and |x8 - x| <= d/2 per element;
    on random data the difference is also small next to y itself."""
    gen = torch.Generator().manual_seed(2)
    w = PackedInt4(group_size=32, **random_int4(gen, 576, 1536, 32, symmetric=symmetric))
    x = torch.randn(4, 1536, generator=gen)
    y8 = cpu_c.w4a8_gemv(x, w)
    y16 = registry.variants("w4a16_gemv")["cpu_c"].fn(x, w)
    xq, d = reference.quantize_rows(x)
    half_step = (d / 2).repeat_interleave(32, dim=1).double()             # [M, K]
    bound = half_step @ reference.int4_format.dequantize(w).double().abs().t()
    diff = (y8 - y16).double().abs()
    assert (diff <= bound * 1.001 + 1e-3).all()
    relative = float(diff.norm() / y16.double().norm())
    print(f"\nW4A8 vs W4A16: relative L2 difference {relative:.2e}")
    assert relative < 0.02


def test_groups_not_a_multiple_of_32_are_refused():
    w = PackedInt4(group_size=16, **random_int4(torch.Generator().manual_seed(3), 8, 64, 16))
    for variant in ("cpu_c", "reference"):
        with pytest.raises(registry.KernelError, match="multiple of 32"):
            registry.variants("w4a8_gemv")[variant].fn(torch.randn(1, 64), w)
    with pytest.raises(ValueError, match="multiple of 32"):
        helper.gemv_w4a8(helper.int4_weight(w.qweight, w.scales, w.mins, 16), torch.randn(1, 64))


def test_a_linear_runs_w4a8_only_when_selected():
    """Llama's decode path stays W4A16 unless a linear is switched (bench/quality.py does)."""
    from engined.layers.linear import Linear
    w = PackedInt4(group_size=32, **random_int4(torch.Generator().manual_seed(4), 40, 96, 32))
    lin, x = Linear.from_packed(w), torch.randn(3, 96)
    assert torch.equal(lin(x), registry.variants("w4a16_gemv")["cpu_c"].fn(x, w))
    lin.select_gemv("w4a8_gemv")
    assert torch.equal(lin(x), cpu_c.w4a8_gemv(x, w))
    lin.select_gemv()
    assert torch.equal(lin(x), registry.variants("w4a16_gemv")["cpu_c"].fn(x, w))


@pytest.mark.parametrize("k, group", [(448, 32), (448, 64), (576, 32), (576, 64), (640, 32),
                                      (640, 64), (96, 32), (160, 32)])
def test_a_row_is_the_same_bits_alone_or_batched(level, group, k):
    """A decode row alone (4 weight rows per x load) and in a batch of 1..8 (one weight row per
    call) take the same operations: greedy decode must not depend on its batch. k of 14, 18
    and 20 blocks ends on 3, 1 and 2 block pairs; k % 64 == 32 (96, 160) takes the kernel that
    goes one block at a time."""
    gen = torch.Generator().manual_seed(k + group)
    w = PackedInt4(group_size=group, **random_int4(gen, 43, k, group))
    x = torch.randn(8, k, generator=gen)
    for rows in (2, 5, 8):
        batched = cpu_c.w4a8_gemv(x[:rows], w)
        for r in range(rows):
            assert torch.equal(cpu_c.w4a8_gemv(x[r:r + 1], w)[0], batched[r]), (rows, r)


@pytest.mark.parametrize("level", [2, 3], ids=level_ids(LEVELS)[2:], indirect=True)
def test_vnni_kernels_are_the_avx2_kernels_bits(level):
    """AVX-VNNI and AVX-512 VNNI change only the integer step (the same exact int32 dots), so
    every output must equal AVX2's bit for bit: lone rows (4 weight rows per call, 512-bit
    pairs of pairs and a lone pair at the end), batches, both group layouts, symmetric, and
    the shapes whose k % 64 == 32 (which run the AVX2 kernel at every level)."""
    gen = torch.Generator().manual_seed(level)
    cases = []
    for k, group, symmetric in ((448, 32, False), (576, 32, True), (640, 64, False),
                                (1024, 128, True), (1056, 32, False), (96, 32, False)):
        w = PackedInt4(group_size=group, **random_int4(gen, 77, k, group, symmetric=symmetric))
        cases.append((w, torch.randn(8, k, generator=gen) * 3))
    helper.w4a8_simd(1)
    want = [[cpu_c.w4a8_gemv(x[:rows], w) for rows in (1, 2, 5, 8)] for w, x in cases]
    assert helper.w4a8_simd(level) == level
    got = [[cpu_c.w4a8_gemv(x[:rows], w) for rows in (1, 2, 5, 8)] for w, x in cases]
    for (w, _), ys, refs in zip(cases, got, want):
        for y, ref in zip(ys, refs):
            assert torch.equal(y, ref), (w.qweight.shape, y.shape)
