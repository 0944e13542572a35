"""What `kimi-engine serve` holds once it has loaded (engined/serving/daemon.py's _load)."""
import gc

import torch

from engined.config import EngineConfig
from engined.serving import daemon
from engined.serving.logs import LogSink


def test_the_loaded_model_is_out_of_the_collectors_sight(tmp_path):
    """A full collection walks every tracked object: with the model's ~181k in sight, 85 ms
    on the model thread, a stall in every stream. After loading, they are frozen."""
    sock = tmp_path / "run" / "engine.sock"
    sock.parent.mkdir(mode=0o700)
    _served, _metrics, engine = daemon._load(
        EngineConfig(model="default", socket=sock, device="cpu", threads=1),
        LogSink(tmp_path / "engine.log"))
    try:
        model = engine.model
        tracked = {id(o) for o in gc.get_objects()}  # the generations: frozen objects are not
        assert id(model) not in tracked and id(engine) not in tracked
        assert gc.get_freeze_count() > 10_000
    finally:
        engine.stop()
        gc.unfreeze()


def test_a_route_trace_is_followed_only_once_the_decode_graphs_are_captured(tmp_path, monkeypatch):
    """KIMI_ROUTE_TRACE: the graphs' warm-up and capture (Engine.start) run the decode step,
    which would take the trace's first positions for scratch rows; the layers in RAM start
    following it after that, at its first position."""
    from engined.engine.loop import Engine
    from engined.layers import route_trace
    trace = tmp_path / "trace.json"
    route_trace.save(route_trace.RouteTrace(torch.tensor([[[0, 1], [2, 3]]]), 8), trace)
    monkeypatch.setenv(route_trace.ENV, str(trace))
    at_start = []
    start = Engine.start

    def in_ram(model) -> list:
        c = model.config
        return [model.layers[i].block_sparse_moe.host_experts
                for i in range(c.num_hidden_layers) if c.is_moe(i)]

    def record_then_start(engine):
        at_start.append([experts.follower for experts in in_ram(engine.model)])
        start(engine)

    monkeypatch.setattr(Engine, "start", record_then_start)
    sock = tmp_path / "run" / "engine.sock"
    sock.parent.mkdir(mode=0o700)
    _served, _metrics, engine = daemon._load(
        EngineConfig(model="synthetic:small", socket=sock, device="cpu", threads=1, cpu_moe=True),
        LogSink(tmp_path / "engine.log"))
    try:
        followers = [experts.follower for experts in in_ram(engine.model)]
        assert at_start == [[None] * 7] and len(followers) == 7
        assert all(f is not None and f.position == 0 for f in followers)
    finally:
        engine.stop()
        gc.unfreeze()
