"""moe_grouped's tl.dot variant (issue 29 item 2) on a real GPU (gpu marker): a 256-token
prefill chunk's routes, top-8, at the 48B's expert shapes (D = 2304, I = 1024), bf16 rows,
codes in the GPU's order, against the fp32 reference and the per-route `triton` variant, with
routes spread over every expert and skewed (one expert in every token's top-8, a third of the
experts chosen by none: the empty and the many-tile groups a real router makes). On
the CPU the equivalence harness runs it interpreted and the sm_90 compile test compiles it."""
import pytest
import torch

from engined import ops  # noqa: F401  (registers every variant)
from engined.ops import registry
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts
from tests.ops.helpers import experts, in_gpu_order

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _cuda(w) -> PackedInt4Experts:
    return PackedInt4Experts(w.qweight.cuda(), w.scales.cuda(),
                             None if w.mins is None else w.mins.cuda(), w.group_size, gpu_order=True)


@pytest.mark.parametrize("symmetric", [True, False])
def test_dot_variant_matches_reference_on_a_prefill_chunk(symmetric):
    gen = torch.Generator().manual_seed(29)
    e, d, inner, t, k = 32, 2304, 1024, 256, 8
    w1, w3 = (_cuda(in_gpu_order(experts(gen, e, inner, d, 32, symmetric))) for _ in range(2))
    w2 = _cuda(in_gpu_order(experts(gen, e, d, inner, 32, symmetric)))
    x = (torch.randn(t, d, generator=gen) * 0.5).bfloat16().cuda()
    uniform = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    # every token's first choice expert 0 (256 routes: several BLOCK_M tiles of one expert),
    # the rest among experts 1..23, so experts 24..31 get no route at all
    skewed = torch.stack([torch.cat((torch.zeros(1, dtype=torch.int64),
                                     1 + torch.randperm(23, generator=gen)[:k - 1])) for _ in range(t)])
    weights = torch.rand(t, k, generator=gen).cuda()
    for routing, picks in (("uniform", uniform.cuda()), ("skewed", skewed.cuda())):
        run = lambda name: registry.variants("moe_grouped")[name].fn(x, w1, w3, w2, picks, weights)  # noqa: E731,B023
        want = run(registry.REFERENCE)
        for name in ("triton_dot", "triton"):
            got = run(name)
            assert (got - want).norm() / want.norm() < 1e-4, (name, routing)
