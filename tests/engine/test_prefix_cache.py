"""Prefix cache: greedy output with the cache equals output without it, token for token, on the
default Llama model and the tiny Kimi-Linear checkpoint; requests resume on the prefill-chunk
grid; restores copy (a snapshot restored twice gives the same result), snapshots may end
mid-KDA-chunk, and the byte budget evicts. (Bit-equality at every split:
test_prefix_cache_determinism.py.)"""

import pytest
import torch

from tests.support import kimi_tiny  # noqa: E402
from tests.engine.batching_helpers import RunningEngine  # noqa: E402

from engined.weights.kimi_checkpoint import load_kimi_linear  # noqa: E402
from engined.engine.prefix_cache import PrefixCache, PrefixKeys  # noqa: E402

HIT = "kimi_engine_prefix_cache_hit_tokens_total"
MISS = "kimi_engine_prefix_cache_miss_tokens_total"
EVICTIONS = "kimi_engine_prefix_cache_evictions_total"
NEW = 8


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    path = kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "tiny")
    return load_kimi_linear(path, progress=False)


def conversation(tokenizer, lengths: tuple[int, ...]) -> list[list[int]]:
    """Prompts of a growing conversation (token prefixes of one text, of these lengths)."""
    text = ("You are a careful assistant. Answer briefly.\nuser: what does a prefix cache do, "
            "and why do agents resend the whole conversation every turn?\n")
    for turn in range(8):
        text += (f"assistant: turn {turn} answer: the engine keeps work done on a prompt's "
                 f"start, keyed by its tokens, and reuses it when request {turn + 1} repeats "
                 "them; only the new tail is computed.\nuser: go on, in more detail please.\n")
    ids = tokenizer.encode(text)
    assert len(ids) >= max(lengths)
    return [ids[:n] for n in lengths]


def greedy_turns(engine, prompts: list[list[int]]) -> tuple[list[list[int]], list[float]]:
    """Each prompt's greedy tokens in turn, and the prefix-cache hit tokens each turn added."""
    got, hits = [], []
    for prompt in prompts:
        before = engine.value(HIT)
        got.append(engine.greedy(prompt, NEW))
        hits.append(engine.value(HIT) - before)
    return got, hits


def test_llama_turns_hit_the_cache_and_match_cold_output(llama):
    prompts = conversation(llama.tokenizer, (150, 230, 300))
    with RunningEngine(llama.model, prefix_cache_bytes=0, prefill_chunk=128) as cold:
        want = [cold.greedy(p, NEW) for p in prompts]
        assert cold.value(HIT) == 0
    with RunningEngine(llama.model, prefill_chunk=128) as warm:
        got, hits = greedy_turns(warm, prompts)
        assert got == want
        # turn N resumes at the last whole chunk that turn N-1 completed (128: neither 150
        # nor 230 completes the chunk at 256)
        assert hits == [0, 128, 128]
        assert warm.value(MISS) == sum(map(len, prompts)) - sum(hits)
        # an identical prompt: the longest cached run of chunks short of its last token
        # (whose logits pick the first new token): here turn 3's chunks up to 256
        assert warm.greedy(prompts[2], NEW) == want[2]
        assert warm.value(HIT) - sum(hits) == 256


def test_llama_small_budget_evicts_and_stays_correct(llama):
    prompts = conversation(llama.tokenizer, (150, 300))
    chunk = 64
    block_bytes = llama.model.kv_bytes_per_token * chunk
    with RunningEngine(llama.model, prefix_cache_bytes=0, prefill_chunk=chunk) as cold:
        want = [cold.greedy(p, NEW) for p in prompts]
    with RunningEngine(llama.model, prefix_cache_bytes=3 * block_bytes,
                       prefill_chunk=chunk) as warm:
        assert [warm.greedy(p, NEW) for p in prompts] == want
        assert warm.value(EVICTIONS) > 0
        assert 0 < warm.value("kimi_engine_prefix_cache_bytes") <= 3 * block_bytes
        # eviction trims a prefix from its end: the first blocks survive and still hit
        before = warm.value(HIT)
        assert warm.greedy(prompts[1], NEW) == want[1]
        assert warm.value(HIT) - before >= chunk


def test_kimi_turns_restore_snapshots_and_match_cold_output(kimi):
    turn1, turn2 = conversation(kimi.tokenizer, (150, 290))
    other = turn1 + turn2[150:][::-1]  # another continuation of turn 1
    prompts = [turn1, turn2, other, turn2]
    with RunningEngine(kimi.model, max_context=512, prefix_cache_bytes=0,
                       prefill_chunk=64) as cold:
        want = [cold.greedy(p, NEW) for p in prompts]
    with RunningEngine(kimi.model, max_context=512, prefill_chunk=64) as warm:
        got, hits = greedy_turns(warm, prompts)
    assert got == want
    # turn 1's snapshot at 128 is restored twice (reference §8 pitfall 2: restores must not
    # mutate it); the repeated turn 2 resumes at its snapshot at 256
    assert hits == [0, 128, 128, 256]


def test_kimi_restore_copies_the_snapshot(kimi):
    model, prompt = kimi.model, conversation(kimi.tokenizer, (160,))[0]
    grid = 100  # a prefill chunk that is not a multiple of the KDA chunk (64)
    keys, store = PrefixKeys(prompt, grid), PrefixCache(64 * 2**20, block=grid)
    cache = model.new_cache(len(prompt) + 4)
    model.forward(torch.tensor(prompt[:100]), cache, 0)
    store.store(cache, keys, 0, 100)
    entry = store.entries[keys(100)]
    pristine = {i: (s.conv.clone(), s.S.clone()) for i, s in entry.state.items()}
    rest = torch.tensor(prompt[100:])
    runs = []
    for _ in range(2):
        fresh = model.new_cache(len(prompt) + 4)
        assert store.restore(fresh, keys, len(prompt) - 1) == 100
        runs.append(model.forward(rest, fresh, 100, last_only=False))
    reference = model.forward(rest, cache, 100, last_only=False)
    assert torch.equal(runs[0], runs[1])
    torch.testing.assert_close(runs[0], reference, rtol=0, atol=0)
    for i, (conv, S) in pristine.items():
        assert torch.equal(entry.state[i].conv, conv) and torch.equal(entry.state[i].S, S)
    store.clear()


def test_prefix_keys_hash_the_exact_prefix():
    tokens = list(range(1000, 1300))
    keys = PrefixKeys(tokens)
    assert keys(130) == PrefixKeys(tokens[:130])(130) == PrefixKeys(tokens[:200])(130)
    assert keys(130) != keys(129) and keys(128) != PrefixKeys([0] + tokens[1:])(128)
