"""The prefill GEMM (w4a16_gemm cpu_c) beyond equivalence: every SIMD level, both INT4 kinds,
rows and threads that do not change a bit, and Linear's CPU paths, none of which builds a whole
fp32 copy of its weight."""
import pytest
import torch

from engined import helper
from engined.layers.linear import Linear
from engined.ops import registry
from engined.ops.int4_format import PackedInt4
from engined.ops.w4a16_gemm import cpu_c, reference
from engined.ops.w4a16_gemv import cpu_c as gemv_cpu_c
from tests.ops.helpers import random_int4
from tests.support.simd import gemv_levels

pytestmark = pytest.mark.skipif(not helper.available(), reason="the C helper is not built")


def packed(n, k, group, symmetric=False, seed=0) -> PackedInt4:
    gen = torch.Generator().manual_seed(seed)
    return PackedInt4(group_size=group, **random_int4(gen, n, k, group, symmetric=symmetric))


level = gemv_levels("Each cap this CPU runs (the others skip); at AVX-512 the GEMM runs AVX2's "
                    "kernel.")


@pytest.fixture
def threads():
    yield
    gemv_cpu_c.set_num_threads(None)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("shape", [(37, 200, 576, 32), (9, 21, 30, 6), (70, 35, 640, 128)],
                         ids=["tiles-of-32", "group-6", "group-128"])
def test_every_kernel_level_matches_reference(level, symmetric, shape):
    m, n, k, group = shape
    w, x = packed(n, k, group, symmetric), torch.randn(m, k)
    got = cpu_c.w4a16_gemm(x, w)
    torch.testing.assert_close(got, reference.w4a16_gemm(x, w), atol=2e-5 * k, rtol=1e-4)


def test_a_row_does_not_depend_on_the_rows_or_threads_beside_it(level, threads):
    w, x = packed(100, 544, 32, seed=1), torch.randn(263, 544)  # 263 rows: 2 passes, tails
    gemv_cpu_c.set_num_threads(1)
    whole = cpu_c.w4a16_gemm(x, w)
    for r in (0, 5, 6, 255, 256, 262):
        assert torch.equal(cpu_c.w4a16_gemm(x[r:r + 1], w)[0], whole[r]), f"row {r}"
        assert torch.equal(cpu_c.w4a16_gemm(x[r:r + 7], w)[0], whole[r]), f"row {r} of 7"
    for n in (2, 3):
        gemv_cpu_c.set_num_threads(n)
        assert torch.equal(cpu_c.w4a16_gemm(x, w), whole)


def test_bad_inputs_get_clear_errors():
    w = packed(40, 96, 32)
    with pytest.raises(registry.KernelError, match=r"x must be \[M, 96\]"):
        cpu_c.w4a16_gemm(torch.randn(20, 95), w)
    with pytest.raises(registry.KernelError, match="out must be"):
        cpu_c.w4a16_gemm(torch.randn(20, 96), w, out=torch.empty(20, 41))


@pytest.mark.parametrize("symmetric", [False, True])
def test_cpu_prefill_rows_never_dequantize_the_weight(monkeypatch, symmetric):
    """Linear on the CPU: decode rows run the GEMV, longer inputs the GEMM; neither builds W in
    fp32 (dense_weight is the old prefill path: N*K*4 bytes per call)."""
    lin = Linear.from_packed(packed(300, 576, 32, symmetric, seed=2))
    monkeypatch.setattr(Linear, "dense_weight", lambda *a: pytest.fail("W dequantized"))
    for rows in (1, helper.MAX_ROWS, helper.MAX_ROWS + 1, 256):
        x = torch.randn(rows, 576)
        torch.testing.assert_close(lin(x), reference.w4a16_gemm(x, lin.packed),
                                   atol=2e-5 * 576, rtol=1e-4)


def test_a_narrower_dense_weight_is_cast_block_by_block(monkeypatch):
    """A bf16 weight under fp32 activations (Kimi-Linear's head) is cast CAST_BLOCK_BYTES at a
    time, with F.linear's result, for inputs longer than decode rows (those run gemv_bf16:
    tests/ops/test_bf16_gemv.py)."""
    lin = Linear(1000, 96, torch.bfloat16)
    lin.weight.copy_(torch.randn(1000, 96))
    monkeypatch.setattr("engined.layers.linear.CAST_BLOCK_BYTES", 96 * 4 * 300)  # 4 blocks
    for rows in (9, 20):
        x = torch.randn(rows, 96)
        assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight.float()))
