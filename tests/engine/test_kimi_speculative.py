"""Speculative decoding on Kimi-Linear through the real engine: the tokens and logprobs of
plain decoding, greedy and seeded, batched, with the prefix cache warm, whichever draft is
rejected; a request cancelled while its drafts are verified gives its state slots back.

Drafts come from prompt lookup (the engine's own), or from an oracle that knows the plain
run's tokens and spoils one draft in most steps, at a position that moves from step to step,
so every rollback position is taken (models/test_kimi_verify.py checks each one's rows)."""
import gc
import time

import pytest

from engined import helper
from engined.engine import speculate
from engined.engine.lookup import PromptLookup
from tests.engine.batching_helpers import RunningEngine, both_ways, collect

pytestmark = pytest.mark.skipif(not helper.available(), reason="the C helper is not built: "
                                "Kimi-Linear verifies drafts with its row-exact kernels")

PROMPTS = [[5, 9, 3, 5, 9, 3, 5, 9, 3, 5, 9, 3, 5, 9, 3, 5, 9, 3, 5],     # repeats: lookup drafts
           [4, 2, 9, 11, 3, 7, 7, 3, 1, 5, 6, 8, 10, 12, 14, 16, 18, 20, 22, 4, 2],
           [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43]]


class Oracle:
    """PromptLookup.draft's stand-in: the plain run's next tokens, at most `longest` of
    them for a prompt, one spoiled in most steps (at the output's length mod the draft's
    length + 1: none spoiled when that is the draft's length)."""

    def __init__(self, plain: dict[tuple, list[int]], longest: dict[tuple, int], vocab: int):
        self.plain, self.longest, self.vocab = plain, longest, vocab

    def __call__(self, lookup, output_ids, k):
        prompt = tuple(lookup.tokens[:lookup.num_prompt])
        n = len(output_ids)
        draft = self.plain[prompt][n:n + min(k, self.longest[prompt])]
        spoiled = n % (len(draft) + 1)
        if spoiled < len(draft):
            draft[spoiled] = (draft[spoiled] + 1) % self.vocab
        return draft


def requests(max_tokens=24):
    return [(PROMPTS[0], max_tokens, {"temperature": 0}),
            (PROMPTS[1], max_tokens, {"temperature": 0.8, "seed": 7}),
            (PROMPTS[2], max_tokens, {"temperature": 0})]


def test_the_engine_speculates_on_kimi_linear_and_keeps_the_plain_tokens(kimi):
    off, on, (drafted, accepted) = both_ways(kimi, requests())
    assert on == off
    assert drafted > 0, drafted


@pytest.mark.parametrize("warm", [False, True])
def test_rejections_at_every_position_with_the_prefix_cache(kimi, monkeypatch, warm):
    """Each request's own longest draft (1, 3, 7: batched sequences verify different k), the
    prefix cache on with 8-token chunks; warm: each request ran once before in the engine."""
    plain = {tuple(p): [t for t, _ in ids] for (p, _, _), ids in
             zip(requests(), both_ways(kimi, requests())[0])}
    longest = {tuple(p): n for p, n in zip(PROMPTS, (1, 3, 7))}
    oracle = Oracle(plain, longest, kimi.config.vocab_size)
    monkeypatch.setattr(PromptLookup, "draft", lambda lookup, out, k: oracle(lookup, out, k))
    monkeypatch.setattr(speculate.DraftLength, "choose", lambda length, match, n, cost: n)  # all of it
    options = {"prefill_chunk": 8, "prefix_cache_bytes": 64 << 20}
    with RunningEngine(kimi, **options) as engine:
        if warm:
            for p, n, params in requests():
                collect(engine.submit(p, n, **params))
        seqs = [engine.submit(p, n, num_top_logprobs=0, **params) for p, n, params in requests()]
        on = [collect(s, logprobs=True) for s in seqs]
        drafted = engine.value("kimi_engine_spec_draft_tokens_total")
        accepted = engine.value("kimi_engine_spec_accepted_tokens_total")
        hits = engine.value("kimi_engine_prefix_cache_hit_tokens_total")
    with RunningEngine(kimi, speculative=False, **options) as engine:
        seqs = [engine.submit(p, n, num_top_logprobs=0, **params) for p, n, params in requests()]
        off = [collect(s, logprobs=True) for s in seqs]
    assert on == off
    assert 0 < accepted < drafted, (accepted, drafted)
    assert (hits > 0) == warm, hits


def test_a_request_cancelled_during_its_verify_step_gives_its_slots_back(kimi, monkeypatch):
    """...and takes at most one of that step's tokens, though all its drafts stand (the
    plain run's tokens): its client has left, and the rest would be waste."""
    prompt = PROMPTS[0]
    with RunningEngine(kimi, speculative=False, prefix_cache_bytes=0) as engine:
        want = engine.greedy(PROMPTS[2], 12)
        plain = engine.greedy(prompt, 64)
    gc.collect()
    before = kimi.state_pool.num_used
    victim, verifying = [], []
    decode_batch = kimi.decode_batch

    def cancelling(tokens, caches, positions):  # the victim's verify step: cancelled inside it
        if len(set(map(id, caches))) < len(caches) and victim and not verifying:
            verifying.append(len(caches))
            victim[0].cancel()
        return decode_batch(tokens, caches, positions)

    monkeypatch.setattr(kimi, "decode_batch", cancelling)
    monkeypatch.setattr(PromptLookup, "draft",
                        lambda lookup, out, k: plain[len(out):len(out) + k]
                        if lookup.tokens[:lookup.num_prompt] == prompt else [])
    monkeypatch.setattr(speculate.DraftLength, "choose", lambda length, match, n, cost: n)  # any match
    with RunningEngine(kimi, prefix_cache_bytes=0) as engine:
        victim.append(engine.submit(prompt, 64))
        deadline = time.monotonic() + 60   # a cancelled request gets no event: its client left
        while not engine.value("kimi_engine_cancelled_requests_total") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert verifying, "no verify step ran"
        assert engine.value("kimi_engine_cancelled_requests_total") == 1
        assert verifying[0] > 2, verifying                   # a draft of 2 or more verified
        assert engine.value("kimi_engine_tokens_after_cancel_total") <= 1
        assert engine.greedy(PROMPTS[2], 12) == want          # the engine serves on
    victim.clear()
    gc.collect()
    assert kimi.state_pool.num_used == before


def test_a_cap_that_holds_the_state_but_not_the_drafts_decodes_without_them(kimi):
    """A speculating Kimi-Linear sequence reserves a state slot per draft; under a memory cap
    that holds its own state and latents but not 7 more states it still runs, plainly."""
    from engined.engine import memory
    prompt, max_tokens = PROMPTS[0], 12
    with RunningEngine(kimi, speculative=False, prefix_cache_bytes=0) as engine:
        want = engine.greedy(prompt, max_tokens)
    own = kimi.kv_bytes_per_token * (len(prompt) + max_tokens) + kimi.state_bytes
    memory.arm(own + kimi.state_bytes)                   # one draft's state more, not seven
    try:
        with RunningEngine(kimi, prefix_cache_bytes=0) as engine:
            got = engine.greedy(prompt, max_tokens)
            drafted = engine.value("kimi_engine_spec_draft_tokens_total")
    finally:
        memory.arm(0)
    assert got == want and drafted == 0
