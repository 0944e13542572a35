"""The decode runner: the buckets it captures, eager decode where nothing is captured (the
CPU, --enforce-eager, a model without a capturable step), and its metrics."""
import pytest
import torch

from engined.config import ConfigError, EngineConfig
from engined.engine import runner
from engined.metrics import EngineMetrics
from engined.models.protocol import StaleGraphs
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


class FakeGraph:
    def __init__(self, step):
        self.step, self.replays = step, 0

    def replay(self):
        self.replays += 1
        self.step.run()


class FakeStep:
    """A graph step over the scripted model: records what it was loaded with."""

    def __init__(self, model, rows, fail_load=False):
        self.model, self.rows, self.fail_load, self.loaded = model, rows, fail_load, None
        self.segments, self.crossings = [self.run], []

    def load_scratch(self):
        self.loaded = ("scratch",)

    def load(self, tokens, caches, positions):
        if self.fail_load:
            raise self.fail_load
        self.loaded = (tokens, positions)
        self.caches = caches

    def run(self):
        pad = self.rows - len(self.caches)
        logits = self.model.decode_batch(torch.tensor(self.loaded[0]), self.caches, self.loaded[1])
        self.logits = torch.cat([logits, torch.zeros(pad, logits.shape[1])])

    def finish(self, caches, positions):
        pass


def cuda_runner(monkeypatch, model, fail=(), fail_load=False, max_batch=8):
    """A runner that believes it is on CUDA, with graphs faked (no GPU needed)."""
    asked = []

    def graph_step(rows, max_context):
        asked.append((rows, max_context))
        return FakeStep(model, rows, fail_load)

    def capture(step, warmup):
        if step.rows in fail:
            raise RuntimeError("capture failed")
        return FakeGraph(step)

    model.graph_step = graph_step
    monkeypatch.setattr(runner.Runner, "device", property(lambda self: torch.device("cuda")))
    monkeypatch.setattr(runner, "_capture", capture)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (10 * 2**20, 20 * 2**20))
    lines, metrics = [], EngineMetrics()
    run = runner.Runner(model, metrics, lines.append, max_batch=max_batch, max_context=512)
    run.capture()
    return run, metrics, lines, asked


def test_buckets_are_captured_largest_first_and_a_batch_replays_its_bucket_padded(monkeypatch):
    model = ScriptedModel(vocab_size=8, script=[6])
    run, metrics, lines, asked = cuda_runner(monkeypatch, model, max_batch=3)
    assert asked == [(4, 512), (2, 512), (1, 512)]       # the largest sizes the pools
    assert sorted(run.graphs) == [1, 2, 4] and sum("captured" in line for line in lines) == 3
    caches = [model.new_cache(8) for _ in range(3)]
    logits = run.decode([1, 2, 3], caches, [0, 0, 0])
    graph, step = run.graphs[4]
    assert graph.replays == 1 and step.loaded == ([1, 2, 3], [0, 0, 0])
    assert logits.shape == (3, 8) and logits.argmax(-1).tolist() == [6, 6, 6]
    assert metric(metrics, "kimi_engine_decode_steps_total", mode="graph", bucket="4") == 1


def test_a_failed_capture_is_counted_and_that_bucket_runs_eagerly(monkeypatch):
    model = ScriptedModel(vocab_size=8, script=[2])
    run, metrics, lines, _ = cuda_runner(monkeypatch, model, fail=(2,), max_batch=2)
    assert sorted(run.graphs) == [1]
    assert metric(metrics, "kimi_engine_graph_capture_failures_total") == 1
    assert any("capture failed for 2 rows" in line for line in lines)
    run.decode([1, 2], [model.new_cache(8) for _ in range(2)], [0, 0])
    assert metric(metrics, "kimi_engine_decode_steps_total", mode="eager", bucket="2") == 1


def test_a_step_that_cannot_load_drops_the_graphs_and_decodes_eagerly(monkeypatch):
    model = ScriptedModel(vocab_size=8, script=[4])
    run, metrics, lines, _ = cuda_runner(monkeypatch, model, fail_load=StaleGraphs("moved"),
                                         max_batch=1)
    logits = run.decode([1], [model.new_cache(8)], [0])
    assert logits.argmax(-1).tolist() == [4] and run.graphs == {}
    assert "decoding eagerly from now on" in lines[-1]
    assert metric(metrics, "kimi_engine_decode_steps_total", mode="eager", bucket="1") == 1


def test_a_load_error_of_one_step_fails_that_step_and_keeps_the_graphs(monkeypatch):
    """A request whose position does not fit its cache fails its step, as it would eagerly;
    the graphs stay: before, any load error dropped every graph for good."""
    model = ScriptedModel(vocab_size=8, script=[4])
    run, metrics, lines, _ = cuda_runner(monkeypatch, model, max_batch=1)
    graph, step = run.graphs[1]
    step.fail_load = ValueError("position 9 does not fit a cache of 8 tokens")
    with pytest.raises(ValueError, match="does not fit"):
        run.decode([1], [model.new_cache(8)], [9])
    assert sorted(run.graphs) == [1]
    step.fail_load = False
    assert run.decode([1], [model.new_cache(8)], [0]).argmax(-1).tolist() == [4]
    assert metric(metrics, "kimi_engine_decode_steps_total", mode="graph", bucket="1") == 1
