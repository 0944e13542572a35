"""The VRAM cache of hot experts (issue 30 item 2), checked on the CPU with the "device" pool
in CPU memory: an LRU pinned on a scripted route sequence, and outputs bit for bit those of
the same model without the cache, eager and piecewise. synthetic:tiny routes top-2: the
cache's share and the CPU's share of a token's two routes add in either order to the same
bits (with top-8, the GPU's sum order differs anyway)."""
import pytest
import torch

from engined.layers.expert_cache import ExpertCache, Split, to_gpu_order_
from engined.ops import int4_format
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts
from engined.ops.w4a16_gemv.cpu_c import torch_single_threaded
from engined.weights import synthetic
from tests.support.cudart import FakeCudart

TINY = synthetic.CONFIGS["tiny"]  # layer 0 dense, layers 1..3 MoE (8 experts, top-2)
MOE_LAYERS = frozenset({1, 2, 3})


def _model(offload=MOE_LAYERS, cache_slots=0):
    return synthetic.build(TINY, "cpu", seed=7, offload=offload, cache_slots=cache_slots)


def _banks(model, layer):
    moe = model.layers[layer].block_sparse_moe
    return tuple(bank.packed for bank in (moe.w1, moe.w3, moe.w2))


def test_lru_hits_misses_and_evictions_on_a_scripted_route_sequence():
    model = _model()
    cache = ExpertCache(3, _banks(model, 1), "cpu", max_uploads=2)
    script = [  # (layer, chosen experts, found {expert: slot}); LRU order after the call
        (1, [0, 1], {}),               # cold: both uploaded, slots 0 and 1     1.0 1.1
        (1, [0, 1], {0: 0, 1: 1}),     #                                        1.0 1.1
        (2, [0, 5, 6], {}),            # 2.0 to free slot 2; 2.5 evicts 1.0; 6 not uploaded
        #                                (two uploads a call)                    1.1 2.0 2.5
        (1, [1, 4], {1: 1}),           # 4 evicts the least recent, 2.0         2.5 1.1 1.4
        (1, [0], {}),                  # 0 evicts 2.5                           1.1 1.4 1.0
        (2, [5, 0], {}),               # 2.5 evicts 1.1, 2.0 evicts 1.4         1.0 2.5 2.0
        (1, [0, 4], {0: 0}),           # 4 evicts 2.5, never 1.0 that it uses   2.0 1.0 1.4
    ]
    for layer, chosen, found in script:
        assert cache.lookup(layer, chosen) == found, (layer, chosen)
        cache.admit(layer, [e for e in chosen if e not in found], _banks(model, layer),
                    set(found.values()))
    assert cache.counters.hits == {1: 4, 2: 0}
    assert cache.counters.misses == {1: 5, 2: 5}
    assert cache.counters.uploads == 9
    assert cache.counters.upload_bytes == 9 * cache.slot_bytes
    assert list(cache._slots.items()) == [((2, 0), 2), ((1, 0), 0), ((1, 4), 1)]


def test_an_uploaded_slot_holds_the_experts_bytes():
    model = _model()
    banks = _banks(model, 2)
    cache = ExpertCache(2, banks, "cpu")
    cache.admit(2, [6], banks, set())
    slot = cache.lookup(2, [6])[6]
    for pool, bank in zip(cache.pool, banks):
        assert torch.equal(pool.qweight[slot], bank.qweight[6])
        assert torch.equal(pool.scales[slot], bank.scales[6])


def _tiled(model):
    """The loader's step (loader._experts): the banks in RAM into the CPU's tiles."""
    model.select_experts("moe_grouped")
    return model


@pytest.mark.parametrize("slots", [8, 24], ids=["a-third", "every-expert"])
def test_banks_in_the_cpus_tiles_give_the_same_bits_with_the_cache_on_and_off(slots):
    """The loader tiles the banks in RAM with a cache too (the CPU's misses run its fastest
    kernels); a pool in CPU memory then holds tiles, so hits and misses run alike."""
    prompt = [5, 17, 300, 41, 9, 77, 123]
    tokens, logits = _greedy(_tiled(_model()), prompt, 8)
    cached = _tiled(_model(cache_slots=slots))
    assert all(bank.tiles for layer in MOE_LAYERS for bank in _banks(cached, layer))
    assert all(pool.tiles for pool in cached.expert_cache.pool)
    tokens_c, logits_c = _greedy(cached, prompt, 8)
    assert tokens_c == tokens and torch.equal(logits_c, logits)
    assert sum(cached.expert_cache.counters.hits.values()) > 0


@pytest.mark.parametrize("tiled", [True, False], ids=["from-tiles", "from-rows"])
def test_a_gpu_pools_upload_ends_in_its_kernels_order(tiled):
    """to_gpu_order_, the device-side step of a CUDA upload, run here on CPU tensors: an
    expert copied as it lies in RAM (tiles or rows) ends as int4_format.gpu_order puts it."""
    model = _tiled(_model()) if tiled else _model()
    banks = _banks(model, 2)
    pool = tuple(PackedInt4Experts(
        *(None if t is None else t[:2].clone() for t in (b.qweight, b.scales, b.mins)),
        b.group_size, gpu_order=True) for b in banks)
    plain = _banks(_model(), 2)                               # the disk's order
    for dst, src in zip(pool, banks):
        for d, s in zip((dst.qweight, dst.scales, dst.mins), (src.qweight, src.scales, src.mins)):
            if d is not None:
                d[1].copy_(s[6])
        to_gpu_order_(dst, 1, tiled)
    for dst, want in zip(pool, plain):
        assert torch.equal(dst.qweight[1], int4_format.gpu_order(want.qweight[6], want.group_size))
        assert torch.equal(dst.scales[1], want.scales[6])
        assert dst.mins is None or torch.equal(dst.mins[1], want.mins[6])


def test_a_split_gives_each_side_only_experts_it_runs():
    ids = torch.tensor([[3, 5], [5, 1], [3, 3]])
    weights = torch.tensor([[.5, .25], [.75, .125], [.5, .5]])
    split = Split(ids, weights, {5: 0}, 8)
    assert split.has_cpu and split.has_device
    assert torch.equal(split.cpu_weights, torch.tensor([[.5, 0], [0, .125], [.5, .5]]))
    assert set(split.cpu_ids.flatten().tolist()) == {1, 3}          # never 5
    assert torch.equal(split.device_weights, torch.tensor([[0, .25], [.75, 0], [0, 0]]))
    assert set(split.slots.flatten().tolist()) == {0}
    assert not Split(ids, weights, {}, 8).has_device


def _greedy(model, prompt, steps):
    cache = model.new_cache(64)
    rows = [model.forward(torch.tensor(prompt), cache, 0)]
    tokens = []
    for _ in range(steps):
        tokens.append(int(rows[-1][-1].argmax()))
        rows.append(model.decode_batch(torch.tensor(tokens[-1:]), [cache], [cache.num_tokens]))
    return tokens, torch.cat(rows)


@pytest.mark.parametrize("slots", [8, 24], ids=["a-third", "every-expert"])
def test_outputs_are_bit_identical_with_the_cache_on_and_off(slots):
    prompt = [5, 17, 300, 41, 9, 77, 123]
    tokens, logits = _greedy(_model(), prompt, 8)
    cached = _model(cache_slots=slots)
    tokens_c, logits_c = _greedy(cached, prompt, 8)
    assert tokens_c == tokens
    assert torch.equal(logits_c, logits)
    counted = cached.expert_cache.counters
    assert sum(counted.hits.values()) > 0 and sum(counted.misses.values()) > 0
    assert set(counted.hits) == MOE_LAYERS


def test_the_piecewise_step_with_the_cache_gives_the_same_logits():
    prompts = [[3, 5, 7, 11], [2, 9], [40, 41, 42]]
    out = []
    for model in (_model(), _model(cache_slots=6)):
        caches = [model.new_cache(32) for _ in prompts]
        tokens = [int(model.forward(torch.tensor(p), c, 0)[-1].argmax()) for p, c in zip(prompts, caches)]
        step, rows = model.graph_step(4, 256), []
        for _ in range(5):
            positions = [c.num_tokens for c in caches]
            step.load(tokens, caches, positions)
            with torch_single_threaded():
                rows.append(step.run()[:3].clone())
            step.finish(caches, positions)
            tokens = rows[-1].argmax(-1).tolist()
        out.append(torch.cat(rows))
        if model.expert_cache is not None:
            assert len(step.pieces()) == 3 * 3 + 1     # segment, shared expert, cached experts
            assert sum(model.expert_cache.counters.hits.values()) > 0
    assert torch.equal(out[0], out[1])


def test_a_buckets_padding_is_looked_up_for_no_expert():
    """3 sequences in the bucket of 4: the cache looks up (and so admits and uploads) only the
    experts the 3 rows chose, and runs nothing for the scratch row (weight 0)."""
    model = _model(offload=frozenset({2}), cache_slots=6)
    caches = [model.new_cache(32) for _ in range(3)]
    tokens = [int(model.forward(torch.tensor(p), c, 0)[-1].argmax())
              for p, c in zip([[3, 5, 7, 11], [2, 9], [40, 41, 42]], caches)]
    step, looked = model.graph_step(4, 256), []
    lookup = model.expert_cache.lookup
    model.expert_cache.lookup = lambda layer, experts: looked.append(experts) or lookup(layer, experts)
    positions = [c.num_tokens for c in caches]
    step.load(tokens, caches, positions)
    with torch_single_threaded():
        step.run()
    host = step.host
    assert looked == [sorted(set(host.ids[:3].flatten().tolist()))]
    assert host.device_weights[3:].eq(0).all() and host.slots[3:].eq(0).all()


def test_a_cache_without_offloaded_layers_is_refused():
    with pytest.raises(ValueError, match="experts are in RAM"):
        _model(offload=frozenset(), cache_slots=4)


def test_metrics_give_each_offloaded_layers_hits_and_misses():
    from engined.metrics import EngineMetrics
    model, metrics = _model(cache_slots=8), EngineMetrics()
    metrics.watch_offload(model.offload_counters)
    _greedy(model, [5, 17, 300], 4)
    counted, sample = model.expert_cache.counters, metrics.registry.get_sample_value
    for layer in MOE_LAYERS:
        for result, want in (("hit", counted.hits[layer]), ("miss", counted.misses[layer])):
            got = sample("kimi_engine_moe_cache_lookups_total", {"layer": str(layer), "result": result})
            assert got == want
    assert sample("kimi_engine_moe_cache_uploads_total", {}) == counted.uploads > 0
    assert sample("kimi_engine_moe_cache_upload_bytes_total", {}) == counted.upload_bytes


def test_the_offloaded_banks_are_page_locked_when_a_cache_uploads_from_them(monkeypatch):
    """On CUDA (synthetic.build and the checkpoint loader call it there) the cache's uploads
    must come from page-locked memory, or each one stages through a pinned buffer on the
    decode thread: every tensor of every offloaded bank is registered once, and nothing else;
    without a cache nothing is."""
    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    offloaded = frozenset({1, 3})
    model = _model(offload=offloaded, cache_slots=4)
    model.page_lock_offloaded_()
    want = {t.data_ptr() for layer in offloaded for bank in _banks(model, layer)
            for t in (bank.qweight, bank.scales, bank.mins) if t is not None}
    assert cudart.locked == want and len(want) >= 6
    _model(offload=offloaded).page_lock_offloaded_()          # no cache: no uploads to speed
    assert cudart.locked == want
