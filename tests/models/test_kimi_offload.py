"""Routed experts in RAM (issue 17): the hybrid MoE step against the same model with every
expert on the device. On the CPU the "device" half runs through the same code and the same
host buffers, so the two must agree bit for bit, and the counters prove the hybrid path ran."""
import pytest
import torch

from engined.weights import synthetic

TINY = synthetic.CONFIGS["tiny"]  # layer 0 dense, layers 1..3 MoE (8 experts, top-2)
MOE_LAYERS = frozenset({1, 2, 3})


def _model(offload=frozenset()):
    return synthetic.build(TINY, "cpu", seed=3, offload=offload)


def _greedy(model, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    cache = model.new_cache(64)
    logits = model.forward(torch.tensor(prompt), cache, 0)
    tokens, rows = [], [logits]
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits = model.decode_batch(torch.tensor(tokens[-1:]), [cache], [cache.num_tokens])
        rows.append(logits)
    return tokens, torch.cat(rows)


@pytest.mark.parametrize("offload", [MOE_LAYERS, frozenset({1})], ids=["cpu-moe", "n-cpu-moe-1"])
def test_experts_in_ram_give_the_same_logits_and_count_what_crossed(offload):
    plain, hybrid = _model(), _model(offload)
    assert plain.offload_counters is None
    prompt = [5, 17, 300, 41, 9, 77, 123]
    tokens, logits = _greedy(plain, prompt, 6)
    tokens_h, logits_h = _greedy(hybrid, prompt, 6)
    assert tokens_h == tokens
    assert torch.equal(logits_h, logits)   # same op, same fp32 rows: bit-identical on the CPU
    counted = hybrid.offload_counters
    calls = len(offload) * (1 + 6)         # one prefill chunk and six decode steps per layer
    assert counted.moe_calls == calls
    d, k = TINY["hidden_size"], TINY["num_experts_per_token"]
    rows = len(prompt) + 6                 # every prompt row once, then one row per step
    assert counted.bytes_to_host == len(offload) * rows * (d * 4 + k * 8 + k * 4)
    assert counted.bytes_to_device == len(offload) * rows * d * 4


def test_batched_rows_agree_with_and_without_offload():
    plain, hybrid = _model(), _model(MOE_LAYERS)
    prompts = [[1, 2, 3], [400, 5], [7, 8, 9, 10, 11]]
    out = []
    for model in (plain, hybrid):
        caches = [model.new_cache(32) for _ in prompts]
        last = [int(model.forward(torch.tensor(p), c, 0)[-1].argmax()) for p, c in zip(prompts, caches)]
        out.append(model.decode_batch(torch.tensor(last), caches, [c.num_tokens for c in caches]))
    assert torch.equal(out[0], out[1])


def test_offloaded_banks_live_in_ram_and_are_still_weights():
    plain, hybrid = _model(), _model(frozenset({2}))
    assert hybrid.weight_bytes == plain.weight_bytes          # host buffers are not weights
    bank = hybrid.layers[2].block_sparse_moe.w1
    assert bank.qweight.device.type == "cpu" and not bank.qweight.is_pinned()
    assert hybrid.layers[1].block_sparse_moe.host_experts is None
    assert len(hybrid.graph_step(2, 64).segments) == 2       # piecewise around the CPU part


def test_offload_is_refused_where_there_are_no_int4_routed_experts():
    with pytest.raises(ValueError, match="no routed experts"):
        _model(frozenset({0}))                                # layer 0 is the dense FFN
    with pytest.raises(ValueError, match="INT4"):
        synthetic.build(TINY, "cpu", int4=False, offload=MOE_LAYERS)
