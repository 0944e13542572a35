"""kda_prefill's fla variant (issue 29 item 1): fla-core's chunk_kda from the sequence's state,
the final state handed back into it, outputs and state equal to our chunked reference and to
T recurrent decode steps (fp32, small shapes).

On the CPU fla's Triton chunk_kda cannot run (not even interpreted: its state kernel calls
.to() on a loop counter), so fla's own naive functions stand in for it: its documented fused
flags (q/k L2 norm, the softplus gate with A_log and dt_bias, beta's sigmoid) applied with
`naive_kda_gate`, then `naive_chunk_kda`. That checks everything our adapter decides (layouts,
flags, the state in and out); the gpu-marked test checks the real kernel.
"""
import inspect
import warnings

import pytest
import torch

from engined import ops  # noqa: F401  (registers every variant)
from engined.layers.kda import kda_gate, l2norm, recurrent_kda_step
from engined.ops import registry
from engined.ops.kda_prefill import fla as fla_variant
from engined.ops.kda_prefill import reference
from tests.ops.prefill_cases import fla_naive_chunk_kda, kda_prefill_case

@pytest.fixture
def fla_on_cpu(monkeypatch):
    monkeypatch.setattr(fla_variant, "chunk_kda", fla_naive_chunk_kda)


def recurrent(q, k, v, r, b, A_log, dt_bias, S, scale):
    """T decode steps (the layer's t == 1 path), S updated in place -> [T, H, V]."""
    g, beta = kda_gate(r, A_log, dt_bias), torch.sigmoid(b.float())
    return torch.stack([recurrent_kda_step(l2norm(q[i].float()), l2norm(k[i].float()), v[i].float(),
                                           g[i], beta[i], S, scale) for i in range(q.shape[0])])


@pytest.mark.parametrize("t,h,k,v", [(2, 3, 16, 8), (17, 2, 32, 16), (64, 2, 16, 16), (100, 3, 16, 24)])
def test_fla_variant_matches_chunked_reference_and_recurrent_steps(fla_on_cpu, t, h, k, v):
    args = kda_prefill_case(t, h, k, v, seed=t).make(torch.Generator().manual_seed(t))
    S_fla, S_ref, S_rec = (args[7].clone() for _ in range(3))
    o_fla = fla_variant.kda_prefill(*args[:7], S_fla, args[8])
    o_ref = reference.kda_prefill(*args[:7], S_ref, args[8])
    o_rec = recurrent(*args[:7], S_rec, args[8])
    for o, S in ((o_ref, S_ref), (o_rec, S_rec)):
        torch.testing.assert_close(o_fla.float(), o, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(S_fla, S, atol=2e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("t", [1000, 64, 7])
def test_real_chunk_kda_matches_reference_at_48b_head_sizes(t):
    """The real kernel, bf16 inputs as the layer gives them, 32 heads of 128, a nonzero state."""
    args = kda_prefill_case(t, 32, 128, 128, torch.bfloat16, seed=5).make(torch.Generator().manual_seed(5))
    args = [x.cuda() if isinstance(x, torch.Tensor) else x for x in args]
    S_fla, S_ref = args[7].clone(), args[7].clone()
    o_fla = fla_variant.kda_prefill(*args[:7], S_fla, args[8]).float()
    o_ref = reference.kda_prefill(*args[:7], S_ref, args[8])
    for got, want in ((o_fla, o_ref), (S_fla, S_ref)):
        assert (got - want).norm() / want.norm() < 1e-2


FLA_READS_FROM_KWARGS = {"A_log", "dt_bias", "chunk_size"}  # fla-core 0.6.0, fla/ops/kda/chunk.py


def test_every_keyword_the_adapter_passes_is_one_the_real_chunk_kda_reads(monkeypatch):
    """fla's chunk_kda takes **kwargs, so a flag it renamed (or we misspelled) would be ignored
    with no error, the GPU would compute another function, and the naive stand-in above, whose
    keywords are ours, would not see it. The adapter's call is bound to the installed
    chunk_kda's signature: each keyword is a named parameter or one it reads from kwargs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # fla: "Triton is not supported"
        from fla.ops.kda import chunk_kda
    params = inspect.signature(chunk_kda).parameters
    seen = {}

    def spy(*args, **kwargs):
        inspect.signature(chunk_kda).bind(*args, **kwargs)
        seen["positional"], seen["keywords"] = len(args), set(kwargs)
        return fla_naive_chunk_kda(*args, **kwargs)

    monkeypatch.setattr(fla_variant, "chunk_kda", spy)
    fla_variant.kda_prefill(*kda_prefill_case(5, 2, 16, 8).make(torch.Generator().manual_seed(0)))
    assert list(params)[:5] == ["q", "k", "v", "g", "beta"] and seen["positional"] == 5
    named = {name for name, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    assert not seen["keywords"] - named - FLA_READS_FROM_KWARGS, "chunk_kda would ignore these"
