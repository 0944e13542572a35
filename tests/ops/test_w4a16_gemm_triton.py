"""The prefill GEMM's Triton variant on a real GPU (gpu marker) at Kimi-Linear's shapes, bf16
rows of a 256-token chunk, codes in the GPU's order. On the CPU the equivalence harness runs it
under TRITON_INTERPRET=1 and tests/ops/test_triton_compile.py compiles it for sm_90."""
import pytest
import torch

from engined import ops  # noqa: F401  (registers every variant)
from engined.ops import registry
from engined.ops.int4_format import PackedInt4
from tests.ops.helpers import in_gpu_order, random_int4

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("m", [256, 9, 2048])
@pytest.mark.parametrize("n,k", [(12288, 2304), (2304, 4096), (1024, 2304)])  # q/k/v, o, expert
@pytest.mark.parametrize("symmetric", [True, False])
def test_triton_gemm_matches_reference_at_kimi_shapes(m, n, k, symmetric):
    gen = torch.Generator().manual_seed(n + k + m)
    w = in_gpu_order(PackedInt4(group_size=32, **random_int4(gen, n, k, 32, symmetric=symmetric)))
    w = PackedInt4(w.qweight.cuda(), w.scales.cuda(), None if w.mins is None else w.mins.cuda(),
                   32, gpu_order=True)
    x = torch.randn(m, k, generator=gen).bfloat16().cuda()
    want = registry.variants("w4a16_gemm")[registry.REFERENCE].fn(x, w)
    got = registry.variants("w4a16_gemm")["triton"].fn(x, w)
    assert (got - want).norm() / want.norm() < 1e-4
