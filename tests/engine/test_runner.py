"""The decode runner: the buckets it captures, eager decode where nothing is captured (the
CPU, --enforce-eager, a model without a capturable step), and its metrics."""
import pytest
import torch

from engined.config import ConfigError, EngineConfig
from engined.engine import runner
from engined.metrics import EngineMetrics
from tests.support.engine import ScriptedModel


@pytest.mark.parametrize("max_batch,want", [(1, (1,)), (3, (1, 2, 4)), (8, (1, 2, 4, 8)),
                                            (9, (1, 2, 4, 8, 16)), (64, (1, 2, 4, 8, 16))])
def test_buckets_cover_max_batch(max_batch, want):
    assert runner.buckets_for(max_batch) == want


def metric(metrics, name, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_the_cpu_decodes_eagerly_and_counts_its_steps(enforce_eager):
    lines, metrics = [], EngineMetrics()
    model = ScriptedModel(vocab_size=8, script=[3, 5])
    run = runner.Runner(model, metrics, lines.append, max_batch=4, enforce_eager=enforce_eager)
    run.capture()
    assert run.graphs == {} and "decode runs eagerly" in lines[-1]
    assert ("--enforce-eager" if enforce_eager else "device cpu") in lines[-1]
    caches = [model.new_cache(8) for _ in range(3)]
    logits = run.decode([1, 2, 3], caches, [0, 0, 0])
    assert logits.shape == (3, 8) and logits.argmax(-1).tolist() == [3, 3, 3]
    assert metric(metrics, "kimi_engine_decode_steps_total", mode="eager", bucket="3") == 1
    assert metric(metrics, "kimi_engine_graph_capture_failures_total") == 0


def test_a_model_without_a_capturable_step_is_not_captured(monkeypatch):
    """On CUDA a model whose graph_step is None decodes eagerly, and says so (no GPU needed:
    the capture stops before touching CUDA)."""
    lines = []
    model = ScriptedModel(vocab_size=8)
    monkeypatch.setattr(runner.Runner, "device", property(lambda self: torch.device("cuda")))
    run = runner.Runner(model, EngineMetrics(), lines.append)
    run.capture()
    assert run.graphs == {} and "no capturable decode step" in lines[-1]


def test_enforce_eager_is_a_config_key():
    assert EngineConfig(enforce_eager="true").enforce_eager is True
    assert EngineConfig.layered({}, {"KIMI_ENGINE_ENFORCE_EAGER": "1"}).enforce_eager is True
    assert EngineConfig().enforce_eager is False
    with pytest.raises(ConfigError, match="enforce-eager: expected true or false"):
        EngineConfig(enforce_eager="maybe")
