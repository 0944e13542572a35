"""Sampling: greedy, seeded draws that do not depend on the batch, top-k/top-p, logprobs.

Re-baselined for the batched on-device sampler (issue 15): a seeded draw is now a pure
function of (seed, position), not of a per-request torch.Generator's state."""
import pytest
import torch

from engined.engine import sampler
from engined.engine.sequence import SamplingParams


def _logits(seed=0, vocab=50):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed))


def draws(logits, params, seed, n, start=0):
    """n tokens drawn at positions start.. from the same logits."""
    return [sampler.sample_rows(logits[None], [params], [seed], [c])[0] for c in range(start, start + n)]


def test_greedy_is_argmax_whatever_the_seed():
    logits = _logits()
    for seed in (1, 2):
        assert draws(logits, SamplingParams(max_tokens=1, temperature=0), seed, 3) == [int(logits.argmax())] * 3
    assert draws(logits, SamplingParams(1, temperature=1.0, top_k=1), 5, 3) == [int(logits.argmax())] * 3


def test_seeded_sampling_repeats_and_the_seed_steers_it():
    logits, params = _logits(), SamplingParams(max_tokens=1, temperature=1.0)
    first, again = draws(logits, params, 42, 40), draws(logits, params, 42, 40)
    assert first == again and len(set(first)) > 1
    assert draws(logits, params, 43, 40) != first


def test_a_rows_draw_does_not_depend_on_the_batch_around_it():
    """The same row drawn alone, among other rows, or padded out: the same token."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(5, 200, generator=gen)
    params = [SamplingParams(1, temperature=0.8, top_p=0.9, top_k=k) for k in (0, 20, 0, 5, 0)]
    seeds, counters = [11, -7, 2**62, 3, 11], [0, 5, 9, 1, 0]
    together = sampler.sample_rows(logits, params, seeds, counters)
    alone = [sampler.sample_rows(logits[b:b + 1], params[b:b + 1], seeds[b:b + 1], counters[b:b + 1])[0]
             for b in range(5)]
    assert together == alone
    greedy_mix = [SamplingParams(1, temperature=0)] + params[1:]
    assert sampler.sample_rows(logits, greedy_mix, seeds, counters)[1:] == together[1:]


def test_draws_follow_the_distribution():
    """Over many positions the frequencies match softmax(logits / T) (chi-square-sized bound)."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    params = SamplingParams(1, temperature=0.7)
    n = 4000
    drawn = torch.tensor(sampler.sample_rows(logits.expand(n, 4), [params] * n, [123] * n, list(range(n))))
    freq = torch.bincount(drawn, minlength=4).double() / n
    want = torch.softmax(logits.double() / 0.7, -1)
    assert (freq - want).abs().max() < 4 * (want * (1 - want) / n).sqrt().max()


def test_uniforms_are_uniform_and_device_independent_bits():
    u = sampler.uniforms(torch.full((20000,), 5, dtype=torch.int64), torch.arange(20000))
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    # splitmix64 known answer: seed 0, counter 0 -> state 0x9E3779B97F4A7C15 -> 0xE220A8397B1DCDAF
    first = sampler.uniforms(torch.tensor([0]), torch.tensor([0]))
    assert float(first[0]) == (0xE220A8397B1DCDAF >> 11) * 2.0 ** -53


def test_top_k_and_top_p_only_draw_allowed_tokens():
    logits = _logits(3)
    top5 = set(torch.topk(logits, 5).indices.tolist())
    drawn = set(draws(logits, SamplingParams(1, top_k=5), 0, 300))
    assert drawn <= top5 and len(drawn) > 1
    # reference nucleus: sort, keep tokens while the mass before them is < p
    probs = torch.softmax(logits, -1)
    order = torch.argsort(probs, descending=True).tolist()
    nucleus, mass = set(), 0.0
    for token in order:
        if mass >= 0.6:
            break
        nucleus.add(token)
        mass += float(probs[token])
    drawn = set(draws(logits, SamplingParams(1, top_p=0.6), 1, 300))
    assert drawn <= nucleus and len(drawn) > 1


def test_min_p_draws_only_tokens_that_likely_and_in_their_proportions():
    """vLLM's min_p: a token stays when p >= min_p x the top token's p (of the
    temperature's distribution); the rest are drawn in their renormalized proportions.
    Ignored before: every token could be drawn."""
    logits = torch.tensor([3.0, 2.5, 1.0, 0.2, -1.0, -4.0])
    params = SamplingParams(1, temperature=0.9, min_p=0.2)
    probs = torch.softmax(logits.double() / 0.9, -1)
    allowed = (probs >= 0.2 * probs.max()).nonzero().flatten().tolist()
    assert allowed == [0, 1]                                  # this case keeps 2 of 6
    n = 3000
    drawn = torch.tensor(sampler.sample_rows(logits.expand(n, 6), [params] * n, [5] * n, list(range(n))))
    assert set(drawn.tolist()) == set(allowed)
    want = probs[allowed] / probs[allowed].sum()
    freq = torch.bincount(drawn, minlength=6).double()[allowed] / n
    assert (freq - want).abs().max() < 4 * (want * (1 - want) / n).sqrt().max()
    plain = sampler.sample_rows(logits.expand(n, 6), [SamplingParams(1, temperature=0.9)] * n,
                                [5] * n, list(range(n)))
    assert set(plain) > set(allowed)                          # without it, more tokens come


def test_new_seed_keeps_a_given_seed_and_draws_a_fresh_one_otherwise():
    assert sampler.new_seed(7) == 7 and sampler.new_seed(2**64 - 1) == -1
    assert sampler.new_seed(None) != sampler.new_seed(None)


def test_logprobs_match_log_softmax():
    logits = _logits(5)
    entry = sampler.token_logprob(logits, 7, num_top=3)
    reference = torch.log_softmax(logits.double(), -1)
    assert entry.logprob == pytest.approx(float(reference[7]), abs=1e-5)
    assert [i for i, _ in entry.top] == torch.topk(reference, 3).indices.tolist()


def test_the_cpu_argmax_is_torchs_first_maximum():
    """argmax_rows reads fp32 CPU rows with numpy: the same ids as torch.argmax, ties to the
    first maximum, masked (-inf) rows included; other dtypes keep torch's."""
    from engined.engine.sampler import argmax_rows
    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(3))
    logits[1, 100] = logits[1, 40000] = 50.0              # a tie: the first one wins
    logits[2] = float("-inf")
    logits[2, 7] = 0.0                                   # a grammar's one allowed token
    logits[3, :] = 1.0                                   # all equal
    for rows in (logits, logits[4:5], logits.to(torch.bfloat16)):
        assert argmax_rows(rows).tolist() == rows.argmax(-1).tolist()
    assert argmax_rows(logits)[1:4].tolist() == [100, 7, 0]


def test_a_sampled_step_sends_the_rows_settings_in_two_tensors(monkeypatch):
    """Each tensor made from a list is a host-to-device copy on a GPU: a sampled step with
    every setting in use (seeds, counters, top-k, top-p, min-p) makes two, whatever B.
    Without numpy, as on the GPU image (the CPU's numpy argmax makes a tensor of its own)."""
    from tests.support.host_copies import host_copies
    monkeypatch.setattr(sampler, "_numpy", False)
    params = [SamplingParams(1, temperature=0.7, top_k=40, top_p=0.9, min_p=0.05),
              SamplingParams(1, temperature=0),
              SamplingParams(1, temperature=1.2, top_p=0.5)]
    logits = torch.stack([_logits(s) for s in range(3)])
    counts = host_copies(lambda: sampler.sample_rows(logits, params, [1, 2, 3], [4, 5, 6]))
    assert counts["lift_fresh"] == 2
