"""Routed experts in RAM on a real GPU (gpu marker; needs the C helper): the piecewise decode
step captured by the runner gives the eager hybrid step's tokens, every step replayed.

Run on a GPU machine: `python -m pytest -q -m gpu tests/models/test_gpu_offload.py`.
"""
import pytest
import torch

from engined import helper
from engined.ops import registry
from tests.support import graph_steps

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(not helper.available(), reason="needs the C helper")]


@pytest.mark.parametrize("offload", [frozenset({2}), frozenset({1, 2, 3})], ids=["one", "all"])
def test_the_piecewise_step_captures_and_replays_the_eager_tokens(offload):
    from engined.weights import synthetic
    model = synthetic.build(synthetic.CONFIGS["tiny"], "cuda", seed=1, offload=offload)
    with torch.inference_mode():
        run = graph_steps.prefilled(model)
        lines = run.lines
        assert sorted(run.runner.graphs) == [1, 2, 4], lines
        assert f"{len(offload) + 1} segments around the CPU experts" in lines[-1], lines
        calls = model.offload_counters.moe_calls
        graph_steps.step_like_eager(run, model)
    assert model.offload_counters.moe_calls - calls == 2 * 4 * len(offload)  # graph + eager
    assert dict(run.metrics.decode_steps.counts) == {("graph", "4"): 4}, lines


def test_the_expert_cache_runs_hits_on_the_gpu_inside_the_captured_step():
    """--moe-cache on a real GPU: uploads land (side stream), later lookups hit, and the
    captured step's logits stay those of the uncached eager step within bf16 rounding (the
    cached experts run in Triton, not in the C helper)."""
    from engined.commands import bench as synthetic_bench
    from engined.engine.runner import Runner
    from engined.weights import synthetic
    every = frozenset({1, 2, 3})
    model = synthetic.build(synthetic.CONFIGS["tiny"], "cuda", seed=1, offload=every, cache_slots=8)
    plain = synthetic.build(synthetic.CONFIGS["tiny"], "cuda", seed=1, offload=every)
    lines, metrics = [], synthetic_bench.runner_metrics()
    with torch.inference_mode():
        runner = Runner(model, metrics, lines.append, max_batch=1, max_context=256)
        runner.capture()
        assert "4 segments around the CPU experts" in lines[-1], lines
        caches = [model.new_cache(64)], [plain.new_cache(64)]
        with registry.using(*graph_steps.PREFILL):
            tokens = [int(m.forward(torch.tensor([3, 5, 7], device="cuda"), c[0], 0).argmax())
                      for m, c in zip((model, plain), caches)][:1]
        for _ in range(12):
            got = runner.decode(tokens, caches[0], [caches[0][0].num_tokens])
            want = plain.decode_batch(torch.tensor(tokens, device="cuda"), caches[1],
                                      [caches[1][0].num_tokens])
            assert (got - want).abs().max() <= 3e-2 * want.abs().max()
            tokens = want.argmax(-1).tolist()
    counted = model.expert_cache.counters
    assert counted.uploads > 0 and sum(counted.hits.values()) > 0, counted
    assert dict(metrics.decode_steps.counts) == {("graph", "1"): 12}, lines  # every step replayed
