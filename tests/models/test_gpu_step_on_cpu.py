"""The GPU's decode step, run on the CPU: every op resolved as on CUDA (registry.standing_in),
the Triton kernels interpreted, must decode the tokens the CPU's own path decodes. The
synthetic model has each layer kind (a dense KDA layer, MoE KDA layers, an MLA layer)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from engined.models.kimi_linear import KimiLinearModel, int4_parts  # noqa: E402
from engined.models.kimi_linear_config import parse_config  # noqa: E402
from engined.ops import registry  # noqa: E402
from engined.weights import synthetic  # noqa: E402
from engined.ops.kda_prefill import fla as fla_prefill  # noqa: E402
from tests.ops.helpers import interpreter_ready, run_fresh  # noqa: E402
from tests.ops.prefill_cases import fla_naive_chunk_kda  # noqa: E402

PROMPTS = ([5, 9, 300, 7, 11], [42, 17])
STEPS = 4
in_process = pytest.mark.skipif(not interpreter_ready(), reason="runs in test_in_a_fresh_process")


def tiny_model() -> KimiLinearModel:
    config = parse_config(synthetic.CONFIGS["tiny"])
    model = KimiLinearModel(config, torch.float32, "cpu", synthetic.selective_int4(config),
                            torch.bfloat16)
    synthetic.fill_random(model, seed=3)
    return model


@torch.inference_mode()
def greedy(model, gpu_step: bool):
    """Both prompts prefilled by the CPU path, then STEPS tokens decoded for both rows at once:
    by the GPU's step (decode_batch with CUDA's ops) or by the CPU's one-token forward."""
    caches = [model.new_cache(32) for _ in PROMPTS]
    tokens = [int(model.forward(torch.tensor(p), c, 0)[-1].argmax()) for p, c in zip(PROMPTS, caches)]
    positions, out, logits = [len(p) for p in PROMPTS], [], []
    for _ in range(STEPS):
        if gpu_step:
            with registry.standing_in("cpu", "cuda"):
                step = model.decode_batch(torch.tensor(tokens), caches, positions)
        else:
            step = torch.cat([model.forward(torch.tensor([t]), c, p)
                              for t, c, p in zip(tokens, caches, positions)])
        tokens = step.argmax(-1).tolist()
        out.append(tokens)
        logits.append(step)
        positions = [p + 1 for p in positions]
    return out, torch.stack(logits)


@in_process
def test_the_gpu_step_decodes_what_the_cpu_path_decodes():
    model = tiny_model()
    want_tokens, want_logits = greedy(model, gpu_step=False)
    got_tokens, got_logits = greedy(model, gpu_step=True)
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_logits, want_logits, atol=2e-4, rtol=1e-4)


@in_process
def test_the_gpu_step_reads_the_codes_repacked_for_it(monkeypatch):
    """A GPU holds its INT4 codes in its kernels' order (to_gpu_order_ at load): prefilled and
    decoded by the GPU's ops from them, the model decodes what its disk-order twin decodes on
    the CPU's path (KDA's prefill through the fla variant, fla's naive functions its kernel)."""
    monkeypatch.setattr(fla_prefill, "chunk_kda", fla_naive_chunk_kda)
    model, repacked = tiny_model(), tiny_model()
    repacked.to_gpu_order_()
    assert repacked.layers[1].self_attn.q_proj.packed.gpu_order         # a view of qkv's rows
    assert torch.equal(repacked.layers[1].self_attn.qkv.dense_weight(torch.float32),
                       model.layers[1].self_attn.qkv.dense_weight(torch.float32))
    want_tokens, want_logits = greedy(model, gpu_step=False)
    with registry.standing_in("cpu", "cuda"):                           # prefill too
        got_tokens, got_logits = greedy(repacked, gpu_step=True)
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_logits, want_logits, atol=2e-4, rtol=1e-4)


def test_a_device_named_without_its_index_still_repacks_every_int4_part():
    """A model made for "cuda" holds tensors that say cuda:0, and torch.device("cuda:0") !=
    torch.device("cuda"): compared that way, to_gpu_order_ skipped every part on the GPU (the
    kernels then read the disk's order). The same mismatch on the CPU: a model made for
    "cpu:0", whose tensors say cpu."""
    config = parse_config(synthetic.CONFIGS["tiny"])
    model = KimiLinearModel(config, torch.float32, "cpu:0", synthetic.selective_int4(config),
                            torch.bfloat16)
    synthetic.fill_random(model, seed=3)
    parts = int4_parts(model)
    assert parts and all(p.qweight.device != model.device for p in parts)
    model.to_gpu_order_()
    assert [p for p in parts if not p.packed.gpu_order] == []


@pytest.mark.skipif(interpreter_ready(), reason="the tests above ran in this process")
def test_in_a_fresh_process():
    run_fresh("tests/models/test_gpu_step_on_cpu.py", "not fresh_process")
