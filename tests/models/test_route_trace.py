"""Routed-expert traces (engined/layers/route_trace.py, bench/route_trace.py): the recorder
keeps what each router picked (checked against the router's top-k computed from its weights);
the spread to larger shapes keeps each position's ids distinct, in range and as reused as the
trace's; the file refuses what does not fit; and the MoE layers in RAM of a model that follows
a trace run exactly its spread experts, eager, piecewise and with the expert cache."""
import gzip

import pytest
import torch

from engined.layers import route_trace
from engined.layers.moe import MoE
from engined.ops.w4a16_gemv.cpu_c import torch_single_threaded
from engined.weights import synthetic
from tests.support import bench, kimi_tiny

TINY = synthetic.CONFIGS["tiny"]  # layer 0 dense, layers 1..3 MoE (8 experts, top-2)
EVERY = frozenset({1, 2, 3})


def _trace(num_layers=3, num_positions=40, num_experts=4, top_k=1, seed=0) -> route_trace.RouteTrace:
    g = torch.Generator().manual_seed(seed)
    routes = torch.stack([torch.stack([torch.randperm(num_experts, generator=g)[:top_k]
                                       for _ in range(num_positions)]) for _ in range(num_layers)])
    return route_trace.RouteTrace(routes, num_experts, path="scripted")


@pytest.fixture(params=["tiny-checkpoint", "synthetic-int4"])
def model(request, tmp_path):
    """The tiny real-format checkpoint (BF16 experts, the recording's model) and synthetic
    tiny INT4 (its decode rows run the fused moe_decode, which routes inside)."""
    if request.param == "synthetic-int4":
        return synthetic.build(TINY, "cpu", seed=3)
    from engined.weights.kimi_checkpoint import load_kimi_linear
    return load_kimi_linear(kimi_tiny.write_tiny_checkpoint(tmp_path / "tiny"), progress=False).model


def test_the_recorder_keeps_each_routers_top_k(model, monkeypatch):
    seen = []  # (layer's MoE, its input rows) in call order
    logits = MoE._logits
    monkeypatch.setattr(MoE, "_logits", lambda self, f, is_decode: (
        seen.append((self, f.clone())), logits(self, f, is_decode))[1])
    prompt = [(7 * i) % 300 + 3 for i in range(45)]
    routes, decoded = bench.load("route_trace").record(model, prompt, new_tokens=5, chunk=20)
    assert routes.shape == (3, 45 + 5, 2) and len(decoded) == 5
    for layer, moe in enumerate(model.layers[i].block_sparse_moe for i in (1, 2, 3)):
        rows = torch.cat([f for m, f in seen if m is moe])                      # [S, D]
        scores = torch.sigmoid(rows.float() @ moe.gate.t())                     # [S, E]
        want = torch.topk(scores + moe.e_score_correction_bias, 2, dim=-1).indices
        assert torch.equal(routes[layer].sort(-1).values, want.sort(-1).values), layer
    assert all(m.route_observer is None for m, _ in seen)  # the observers are gone


@pytest.mark.parametrize("trace_shape,model_shape", [
    ((8, 2), (256, 8)), ((8, 2), (32, 4)), ((8, 2), (8, 2)), ((4, 1), (8, 2)), ((8, 3), (256, 8))])
def test_a_spread_position_is_distinct_in_range_and_as_long_as_top_k(trace_shape, model_shape):
    (from_experts, k), (num_experts, top_k) = trace_shape, model_shape
    trace = _trace(num_layers=2, num_positions=60, num_experts=from_experts, top_k=k)
    spread = route_trace.spread(trace, 5, num_experts, top_k)
    assert spread.shape == (5, 60, top_k)
    assert torch.equal(spread, route_trace.spread(trace, 5, num_experts, top_k))  # deterministic
    assert torch.equal(spread[2], spread[0]) and torch.equal(spread[3], spread[1])  # layer j: j mod 2
    assert int(spread.min()) >= 0 and int(spread.max()) < num_experts
    assert all(len(set(ids)) == top_k for layer in spread.tolist() for ids in layer)
    for ids, mapped in zip(trace.routes[0].tolist(), spread[0].tolist()):   # e's own spread
        assert {x % from_experts for x in mapped} == set(ids)


def test_the_spread_keeps_the_traces_reuse():
    """The 48B's shapes: a trace expert's first ids are the same in every position that chose
    it; a position choosing the same experts as another gets the same ids."""
    one = route_trace.spread_token([3, 5], 8, 256, 8)
    assert one == route_trace.spread_token([3, 5], 8, 256, 8)
    assert set(one[:2]) & set(route_trace.spread_token([3, 1], 8, 256, 8)) == set(one[:2])
    assert set(one) & set(route_trace.spread_token([6, 1], 8, 256, 8)) == set()


def test_a_trace_file_round_trips_and_refuses_what_does_not_fit(tmp_path):
    trace = route_trace.RouteTrace(_trace().routes, 4, {"source": {"capture": "x"}})
    for name in ("t.json", "t.json.gz"):
        route_trace.save(trace, tmp_path / name)
        back = route_trace.load(tmp_path / name)
        assert torch.equal(back.routes, trace.routes) and back.num_experts == 4
        assert back.info["source"] == {"capture": "x"} and back.info["model"]["top_k"] == 1
    with pytest.raises(ValueError, match="chose one expert twice"):
        route_trace.RouteTrace(torch.tensor([[[1, 1]]]), 4)
    with pytest.raises(ValueError, match=r"expert ids must be 0\.\.3"):
        route_trace.RouteTrace(torch.tensor([[[4]]]), 4)
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    (tmp_path / "list.json").write_text('[1, 2]')
    (tmp_path / "torn.json.gz").write_bytes(gzip.compress(b'{"format": "x"}' * 64)[:40])
    (tmp_path / "plain.json.gz").write_bytes(b'{"format": "x"}')
    spoiled = bytearray(gzip.compress(b'{"format": "x"}' * 64))
    spoiled[12] ^= 0xFF                                   # zlib.error: invalid code lengths
    (tmp_path / "spoiled.json.gz").write_bytes(bytes(spoiled))
    (tmp_path / "huge.json").write_text(
        '{"format": "kimi-local route trace 1", "model": {"num_experts": Infinity}, '
        '"routes": [[[0]]]}')
    for name in ("bad.json", "list.json", "torn.json.gz", "plain.json.gz", "spoiled.json.gz",
                 "huge.json"):
        with pytest.raises(ValueError, match="not a kimi-local route trace 1 file"):
            route_trace.load(tmp_path / name)
    wide = _trace(num_experts=8, top_k=2)
    with pytest.raises(ValueError) as refused:
        route_trace.spread(wide, 3, 8, 1)
    message = str(refused.value)
    assert "\n" not in message and "3 MoE layers x 8 experts, top-2" in message
    assert "3 MoE layers x 8 experts, top-1" in message


def test_the_checked_in_trace_fits_the_48b_and_the_dry_runs_model():
    trace = route_trace.load(bench.BENCH / "data" / "route-trace-claude-tool.json.gz")
    assert trace.routes.shape[0] == 3 and trace.num_experts == 8
    assert trace.info["source"]["capture"].endswith("claude-tool.jsonl.gz")
    for name in ("kimi-linear-48b", "small"):
        c = synthetic.CONFIGS[name]
        route_trace.spread(trace, 26, c["num_experts"], c["num_experts_per_token"])


def _following(offload, cache_slots=0, trace=None):
    """synthetic tiny with `offload` following `trace`; each layer in RAM's CPU experts
    recorded: layer -> [ids [T, k] of each call]."""
    model = synthetic.build(TINY, "cpu", seed=5, offload=offload, cache_slots=cache_slots)
    trace = trace or _trace()
    line = route_trace.follow(model, trace, offload)
    assert f"({len(offload)} of 3 MoE layers) follow the route trace scripted" in line
    ran = {i: [] for i in offload}
    for i in offload:
        host = model.layers[i].block_sparse_moe.host_experts
        host._grouped = (lambda grouped, calls: lambda x, w1, w3, w2, ids, weights, out: (
            calls.append(ids.clone()), grouped(x, w1, w3, w2, ids, weights, out=out))[1])(
                host._grouped, ran[i])
    return model, route_trace.spread(trace, 3, 8, 2), ran


def test_the_layers_in_ram_run_the_spread_trace_eager_and_piecewise():
    model, spread, ran = _following(frozenset({1, 3}))
    cache = model.new_cache(64)
    with torch.inference_mode():
        model.forward(torch.tensor([3, 5, 7, 11, 13]), cache, 0)                  # 5 positions
        model.decode_batch(torch.tensor([2]), [cache], [5])                       # 1
        step = model.graph_step(2, 256)            # a bucket of 2 rows, 1 live: piecewise
        for position in (6, 7):
            step.load([4], [cache], [position])
            with torch_single_threaded():
                step.run()
            step.finish([cache], [position])
    for layer, j in ((1, 0), (3, 2)):                                             # MoE index j
        calls = ran[layer]
        assert [len(c) for c in calls] == [5, 1, 1, 1]      # the padding row costs nothing
        assert torch.equal(torch.cat([calls[0], calls[1]]), spread[j][:6])
        assert torch.equal(calls[2][:1], spread[j][6:7]) and torch.equal(calls[3][:1], spread[j][7:8])
    assert model.layers[2].block_sparse_moe.host_experts is None                 # on the device


def test_the_expert_cache_looks_up_the_spread_trace():
    model, spread, _ = _following(EVERY, cache_slots=6)
    looked = []
    lookup = model.expert_cache.lookup
    model.expert_cache.lookup = lambda layer, chosen: (looked.append((layer, chosen)),
                                                       lookup(layer, chosen))[1]
    cache = model.new_cache(64)
    with torch.inference_mode():
        model.forward(torch.tensor([3, 5, 7]), cache, 0)
        for position in range(3, 43):                          # past the 40 positions: cycles
            model.decode_batch(torch.tensor([position]), [cache], [position])
    for j, layer in enumerate((1, 2, 3)):
        mine = [chosen for at, chosen in looked if at == layer]
        want = [spread[j][:3]] + [spread[j][p % 40][None] for p in range(3, 43)]
        assert mine == [torch.unique(w).tolist() for w in want], layer
    counted = model.expert_cache.counters
    assert sum(counted.hits.values()) > 0


def test_no_layer_in_ram_leaves_the_routers_and_the_env_names_the_file(tmp_path):
    model = synthetic.build(TINY, "cpu", seed=5)
    assert "the routers choose" in route_trace.follow(model, _trace(), frozenset())
    route_trace.save(_trace(), tmp_path / "t.json")
    assert route_trace.from_env({}) is None
    assert route_trace.from_env({route_trace.ENV: str(tmp_path / "t.json")}).num_experts == 4
