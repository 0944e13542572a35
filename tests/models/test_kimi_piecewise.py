"""The piecewise decode step of a model with routed experts in RAM (issue 30 item 1), run on
the CPU: the GPU segments eagerly, the CPU experts between them. synthetic:tiny with
offloaded layers gives the plain model's logits bit for bit, batched and not; the step has a
segment per offloaded MoE layer plus one; and the runner, believing it is on CUDA, captures
it piece by piece (graphs faked) and decodes the same tokens."""
import gc

import pytest
import torch

from engined.engine import runner
from engined.layers.moe_offload import HostBuffers
from tests.support.cudart import FakeCudart
from engined.models.kimi_piecewise import KimiPiecewiseStep
from engined.ops.w4a16_gemv.cpu_c import torch_single_threaded
from engined.weights import synthetic

TINY = synthetic.CONFIGS["tiny"]  # layer 0 dense, layers 1..3 MoE (8 experts, top-2)
PROMPTS = [[3, 5, 7, 11], [2, 9], [40, 41, 42]]


def _model(offload=frozenset()):
    return synthetic.build(TINY, "cpu", seed=5, offload=offload)


def _prefilled(model, prompts):
    caches = [model.new_cache(32) for _ in prompts]
    firsts = [int(model.forward(torch.tensor(p), c, 0)[-1].argmax()) for p, c in zip(prompts, caches)]
    return caches, firsts


def _run(step, caches, tokens):
    positions = [c.num_tokens for c in caches]
    step.load(tokens, caches, positions)
    with torch_single_threaded():                                # as decode_batch runs
        logits = step.run()[:len(caches)].clone()
    step.finish(caches, positions)
    return logits


def _plain_steps(prompts, steps, bucket=None):
    """The plain model's logits step after step: its graph step padded to `bucket` rows (the
    full-GPU graph; padding changes a GEMM's blocking, so the same bucket), else decode_batch."""
    model = _model()
    caches, tokens = _prefilled(model, prompts)
    step = model.graph_step(bucket, 256) if bucket else None
    out = []
    for _ in range(steps):
        logits = (_run(step, caches, tokens) if step else
                  model.decode_batch(torch.tensor(tokens), caches, [c.num_tokens for c in caches]))
        out.append(logits)
        tokens = logits.argmax(-1).tolist()
    return out


@pytest.mark.parametrize("prompts,bucket", [(PROMPTS[:1], 1), (PROMPTS, 4)], ids=["alone", "batched"])
@pytest.mark.parametrize("offload", [frozenset({2}), frozenset({1, 3})], ids=["layer-2", "layers-1-3"])
def test_the_piecewise_step_gives_the_plain_models_logits_bit_for_bit(prompts, bucket, offload):
    plain, eager = _plain_steps(prompts, 4, bucket), _plain_steps(prompts, 4)
    model = _model(offload)
    caches, tokens = _prefilled(model, prompts)
    step = model.graph_step(bucket, 256)
    assert isinstance(step, KimiPiecewiseStep)
    assert len(step.segments) == len(offload) + 1 == len(step.crossings) + 1
    assert len(step.pieces()) == 2 * len(offload) + 1          # each crossing's shared expert
    calls = model.offload_counters.moe_calls
    for want, lone in zip(plain, eager):
        logits = _run(step, caches, tokens)
        assert torch.equal(logits, want)
        assert logits.argmax(-1).tolist() == lone.argmax(-1).tolist()
        tokens = logits.argmax(-1).tolist()
    assert model.offload_counters.moe_calls - calls == 4 * len(offload)


def test_a_buckets_padding_costs_the_cpu_experts_nothing():
    """3 sequences in the bucket of 4: the CPU experts run the 3 rows (the scratch row's
    routes cost it a fourth more before); the bit-for-bit test above holds the 3 rows'
    logits to the plain model's."""
    model = _model(frozenset({1, 3}))
    caches, tokens = _prefilled(model, PROMPTS)
    step, ran = model.graph_step(4, 256), []
    for layer in (1, 3):
        host = model.layers[layer].block_sparse_moe.host_experts
        host._grouped = (lambda grouped: lambda x, *a, **k: ran.append(x.shape[0]) or grouped(x, *a, **k))(host._grouped)
    step.host.out.fill_(float("nan"))  # padding rows' outputs are written, not left
    _run(step, caches, tokens)
    assert ran == [3, 3]
    assert step.host.out[3:].eq(0).all()


def test_the_runner_captures_the_pieces_in_order_and_replays_them(monkeypatch):
    """On CUDA the runner records each piece (here: graphs faked by the pieces themselves)
    in one pool per bucket, and a decode replays them with the CPU experts between."""
    recorded = []
    monkeypatch.setattr(runner.Runner, "device", property(lambda self: torch.device("cuda")))
    monkeypatch.setattr(runner, "_warm_up", lambda step, warmup: step.run())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(runner, "_record", lambda piece, pool: recorded.append((piece, pool)) or piece)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (10 * 2**20, 20 * 2**20))
    model, lines = _model(frozenset({2})), []
    run = runner.Runner(model, None, lines.append, max_batch=1, max_context=256)
    run.capture()
    _, step = run.graphs[1]
    assert [piece for piece, _ in recorded] == [step.segments[0], step.crossings[0].overlap,
                                                step.segments[1]]
    assert len({id(pool) for _, pool in recorded}) == 1
    assert "2 segments around the CPU experts" in lines[-1]
    caches, tokens = _prefilled(model, PROMPTS[:1])
    for want in _plain_steps(PROMPTS[:1], 3):
        with torch_single_threaded():
            logits = run.decode(tokens, caches, [caches[0].num_tokens])
        assert torch.equal(logits, want)
        tokens = logits.argmax(-1).tolist()


def test_host_rows_stay_page_locked_while_their_memory_lives(monkeypatch):
    """KimiPiecewiseStep keeps only the rows it takes (views) of a HostBuffers it drops, and is
    built under inference_mode (the engine's capture): the rows must stay registered until
    their memory goes, or the graphs copy from pageable memory. It failed on the code before:
    every row was unregistered as the constructor returned."""
    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    with torch.inference_mode():
        rows = HostBuffers(16, 2, "cuda", for_graphs=True).take(4)
        gc.collect()
        assert {t.data_ptr() for t in rows} <= cudart.locked
        del rows
        gc.collect()
        assert not cudart.locked  # nothing stays locked once its memory is freed
