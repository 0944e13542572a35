"""gemv_bf16: the C GEMV a bf16 CPU weight runs for decode rows (Kimi-Linear's kept
projections and LM head under fp32 activations), against float64 dots, at every SIMD level
present (printed), and through Linear against the blockwise-cast matmul it replaces there."""
import pytest
import torch
import torch.nn.functional as F

from engined import helper
from engined.layers.linear import Linear
from tests.support.simd import gemv_levels


level = gemv_levels("Each cap this CPU runs (the others skip); at AVX-512 the bf16 kernel is "
                    "AVX2's.")


@pytest.mark.parametrize("rows,n,k", [(1, 7, 40), (3, 301, 576), (8, 64, 2304), (11, 33, 17)])
def test_matches_float64_dots(level, rows, n, k):
    gen = torch.Generator().manual_seed(rows * n + k)
    w = torch.randn(n, k, generator=gen).bfloat16()
    x = torch.randn(rows, k, generator=gen)
    want = (x.double() @ w.double().t()).float()
    got = helper.gemv_bf16(w, x, None, 2)
    assert torch.allclose(got, want, atol=1e-5 * k ** 0.5, rtol=1e-5)


def test_a_row_does_not_depend_on_its_batch(level):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(129, 256, generator=gen).bfloat16()
    x = torch.randn(6, 256, generator=gen)
    batched = helper.gemv_bf16(w, x, None, 2)
    for r in range(6):
        assert torch.equal(helper.gemv_bf16(w, x[r:r + 1], None, 2)[0], batched[r])


def test_linear_uses_it_for_decode_rows_only():
    gen = torch.Generator().manual_seed(2)
    lin = Linear(96, 64, torch.bfloat16)
    lin.weight.copy_(torch.randn(96, 64, generator=gen))
    for rows in (1, 8, 9, 40):                 # 9 and 40: the blockwise cast + matmul
        x = torch.randn(rows, 64, generator=gen)
        assert lin._is_c_bf16(x) == (rows <= helper.MAX_ROWS)
        assert torch.allclose(lin(x), F.linear(x, lin.weight.float()), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="bf16"):
        helper.gemv_bf16(lin.weight.float(), torch.randn(1, 64))
