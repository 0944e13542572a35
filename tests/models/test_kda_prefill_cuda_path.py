"""A KDA layer's prefill through the CUDA path on CPU tensors: the short convolutions and the
gated output norm in Triton (interpreted), kda_prefill through fla's adapter (fla's naive
functions standing in for its kernel: tests/ops/test_kda_prefill.py says why), against the
same tokens one decode step each through the CPU's reference ops."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from engined import ops  # noqa: E402,F401  (registers every variant)
from engined.layers.kda import KDA  # noqa: E402
from engined.ops import registry  # noqa: E402
from engined.ops.kda_prefill import fla as fla_variant  # noqa: E402
from tests.ops.helpers import interpreter_ready, run_fresh  # noqa: E402
from tests.ops.prefill_cases import fla_naive_chunk_kda  # noqa: E402

in_process = pytest.mark.skipif(not interpreter_ready(), reason="runs in test_in_a_fresh_process")


@in_process
@pytest.mark.parametrize("prefill", ["fla", "reference"])
@pytest.mark.parametrize("split", [70, 2])
def test_layer_prefill_on_the_cuda_path_resumes_mid_prompt(monkeypatch, split, prefill):
    """`split` tokens, then the rest from the state and conv windows they left (2: a chunk
    shorter than the window, which keeps one of its old inputs), equal the same 120 tokens
    one decode step each: outputs, recurrent state and windows. kda_prefill through fla (the
    CUDA default) and through our reference, which bench/gpu_quick.py and the GPU graph tests
    select on CUDA (fla's first call autotunes): its output went to the Triton gated norm
    strided, which refused it."""
    monkeypatch.setattr(fla_variant, "chunk_kda", fla_naive_chunk_kda)
    torch.manual_seed(0)
    layer = KDA(hidden=48, num_heads=2, head_dim=16, conv_size=4, eps=1e-5, dtype=torch.float32)
    for w in (layer.qkv.weight, layer.low.weight, layer.f_b_proj.weight, layer.g_b_proj.weight,
              layer.o_proj.weight, layer.conv_w, layer.A_log, layer.dt_bias, layer.o_norm.weight):
        w.copy_(torch.randn_like(w) * 0.3)
    a = torch.randn(120, 48)
    chunks, steps = layer.new_state(torch.float32, "cpu"), layer.new_state(torch.float32, "cpu")
    with registry.standing_in("cpu", "cuda"), registry.using("kda_prefill", prefill):
        assert [registry.resolve(op, "cpu").name for op in ("short_conv", "kda_prefill",
                                                            "gated_rmsnorm")] == ["triton", prefill, "triton"]
        got = torch.cat([layer(a[:split], chunks), layer(a[split:], chunks)])
    want = torch.cat([layer(a[i:i + 1], steps) for i in range(120)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(chunks.S, steps.S, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunks.conv, steps.conv)


@pytest.mark.skipif(interpreter_ready(), reason="the tests above ran in this process")
def test_in_a_fresh_process():
    run_fresh("tests/models/test_kda_prefill_cuda_path.py", "not fresh_process")
