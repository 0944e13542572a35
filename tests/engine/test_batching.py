"""Continuous batching: concurrent greedy requests produce exactly the tokens each produces
alone (batched decode rows are bit-identical to lone ones), cancelling one leaves the others
untouched, and prefill chunks alternate with decode steps (no stream waits more than one
chunk for its next token)."""

import pytest
import torch

from tests.support import kimi_tiny  # noqa: E402
from tests.engine.batching_helpers import NullDecoder, RunningEngine, collect  # noqa: E402
from tests.support.engine import ScriptedModel  # noqa: E402

from engined.weights.kimi_checkpoint import load_kimi_linear  # noqa: E402
from engined.engine.scheduler import Scheduler  # noqa: E402
from engined.engine.sequence import SamplingParams, Sequence, TokenEvent  # noqa: E402

TEXTS = ["def fibonacci(n):\n    ", "The capital of France is",
         "Once upon a time, in a land far away, there lived a",
         "import numpy as np\n\n# Multiply two matrices and print the"]
NEW = 16


@pytest.fixture(scope="module")
def solo(llama):
    """Each prompt alone: (prompt ids, greedy ids)."""
    prompts = [llama.tokenizer.encode(t) for t in TEXTS]
    with RunningEngine(llama.model, prefix_cache_bytes=0) as engine:
        return prompts, [engine.greedy(p, NEW) for p in prompts]


def largest_decode_batch(engine) -> int:
    return max(len(ids) for kind, ids in engine.engine.step_log if kind == "decode")


def test_decode_batch_rows_are_bit_identical_to_lone_rows(llama):
    model = llama.model
    prompts = [llama.tokenizer.encode(t) for t in TEXTS[:3]]
    caches = [model.new_cache(len(p) + 1) for p in prompts]
    for prompt, cache in zip(prompts, caches):
        model.forward(torch.tensor(prompt), cache, 0)
    copies = [type(c)(c.data.clone()) for c in caches]
    tokens, positions = torch.tensor([11, 22, 33]), [len(p) for p in prompts]
    together = model.decode_batch(tokens, caches, positions)  # [3, V]
    for i, cache in enumerate(copies):  # tolerance 0: same bits, not merely close
        assert torch.equal(model.decode_batch(tokens[i:i + 1], [cache], positions[i:i + 1])[0],
                           together[i])


def test_four_concurrent_greedy_requests_equal_each_alone(llama, solo):
    prompts, want = solo
    with RunningEngine(llama.model, prefix_cache_bytes=0) as engine:
        seqs = [engine.submit(p, NEW) for p in prompts]
        assert [collect(s) for s in seqs] == want
        assert largest_decode_batch(engine) == 4


def test_cancelling_one_leaves_the_others_untouched(llama, solo):
    prompts, want = solo
    with RunningEngine(llama.model, prefix_cache_bytes=0) as engine:
        seqs = [engine.submit(p, NEW) for p in prompts]
        assert isinstance(seqs[1].events.get(timeout=60), TokenEvent)
        seqs[1].cancel()
        kept = [0, 2, 3]
        assert [collect(seqs[i]) for i in kept] == [want[i] for i in kept]
        assert engine.value("kimi_engine_cancelled_requests_total") == 1
        assert len(seqs[1].output_ids) < NEW


def test_kimi_concurrent_requests_equal_each_alone(tmp_path):
    loaded = load_kimi_linear(kimi_tiny.write_tiny_checkpoint(tmp_path / "tiny"), progress=False)
    prompts = [loaded.tokenizer.encode(t) for t in TEXTS]
    with RunningEngine(loaded.model, max_context=512, prefix_cache_bytes=0) as engine:
        want = [engine.greedy(p, 8) for p in prompts]
        seqs = [engine.submit(p, 8) for p in prompts]
        assert [collect(s) for s in seqs] == want
        assert largest_decode_batch(engine) == 4  # one step, one forward per sequence


def test_a_long_prompt_does_not_stall_a_stream():
    model = ScriptedModel(vocab_size=100, script=[7] * 400, delay_s=0.002)
    with RunningEngine(model, max_context=4096, prefill_chunk=64) as engine:
        stream = engine.submit([1, 2, 3], max_tokens=300)  # outlasts the long prompt
        assert isinstance(stream.events.get(timeout=30), TokenEvent)
        long = engine.submit(list(range(5, 5 + 1000)), max_tokens=2)
        assert len(collect(long)) == 2 and len(collect(stream)) == 299
        log = list(engine.engine.step_log)
    kinds = [kind for kind, ids in log if stream.seq_id in ids or long.seq_id in ids]
    prefills = [i for i, (kind, ids) in enumerate(log) if kind == "prefill" and long.seq_id in ids]
    assert len(prefills) == 16  # ceil(1000 / 64) chunks
    between = [kinds[a + 1:b] for a, b in zip(prefills, prefills[1:])]
    assert all(steps == ["decode"] for steps in between)  # each chunk, then the stream's token
    assert engine.value("kimi_engine_steps_total", kind="prefill") == 17


def test_scheduler_caps_running_and_alternates():
    scheduler = Scheduler(token_budget=10_000, max_batch=2)
    seqs = [Sequence([1] * 100, SamplingParams(4), NullDecoder()) for _ in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    assert scheduler.admit() == seqs[:2] and scheduler.num_waiting == 1
    first = scheduler.next_batch()
    assert first.kind == "prefill" and first.seqs == (seqs[0],)
    seqs[0].num_computed = 100  # its prompt is done: it decodes from now on
    kinds = [scheduler.next_batch() for _ in range(4)]
    assert [(b.kind, b.seqs) for b in kinds] == [("decode", (seqs[0],)), ("prefill", (seqs[1],)),
                                                 ("decode", (seqs[0],)), ("prefill", (seqs[1],))]


def test_batching_and_cache_options_are_layered_and_checked():
    from engined.config import ConfigError, EngineConfig

    config = EngineConfig.layered({"max-batch": 4, "prefill-chunk": None},
                                  {"KIMI_ENGINE_PREFILL_CHUNK": "128",
                                   "KIMI_ENGINE_PREFIX_CACHE_BYTES": "64MiB"})
    assert (config.max_batch, config.prefill_chunk, config.prefix_cache_bytes) == (4, 128, 64 << 20)
    assert EngineConfig().prefix_cache_bytes == 256 << 20 and EngineConfig().max_batch == 8
    for bad in ({"max_batch": 0}, {"prefill_chunk": "many"}, {"prefix_cache_bytes": "lots"}):
        with pytest.raises(ConfigError, match=next(iter(bad)).replace("_", "-")):
            EngineConfig(**bad)


def test_the_log_says_once_why_a_request_waits_for_kv_room():
    """A request without max_tokens reserves the rest of --max-context (the API layer fills it
    in), so another waits for it to end: the engine log names both, once."""
    from engined.engine.loop import Engine
    from engined.metrics import EngineMetrics

    lines = []
    engine = Engine(ScriptedModel(vocab_size=100, script=[7] * 400, delay_s=0.002), 310,
                    EngineMetrics(), log=lines.append)
    engine.start()
    try:
        whole = Sequence([1, 2, 3], SamplingParams(300, temperature=0), NullDecoder(),
                         request_id="whole")
        engine.submit(whole)
        assert isinstance(whole.events.get(timeout=30), TokenEvent)
        held = Sequence([4, 5], SamplingParams(8, temperature=0), NullDecoder(), request_id="held")
        engine.submit(held)
        assert len(collect(held)) == 8 and len(collect(whole)) == 299  # after `whole` ended
    finally:
        engine.stop()
    assert [line for line in lines if "KV room" in line] == [
        "request held waits for KV room: it needs 2 prompt + 8 max_tokens, and the 1 running "
        "reserve 303 of --max-context 310 (most: request whole, 3 + 300). Requests that set "
        "max_tokens reserve less; a larger --max-context runs more at once"]
