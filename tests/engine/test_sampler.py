"""Sampling: greedy, seeded draws, top-k/top-p, logprobs."""

import pytest
import torch

from engined.engine import sampler
from engined.engine.sequence import SamplingParams


def _logits(seed=0, vocab=50):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_argmax_and_ignores_the_generator():
    logits = _logits()
    params = SamplingParams(max_tokens=1, temperature=0)
    assert sampler.sample(logits, params, sampler.new_generator(1)) == int(logits.argmax())
    assert sampler.sample(logits, SamplingParams(1, temperature=1.0, top_k=1),
                          sampler.new_generator(2)) == int(logits.argmax())


def test_seeded_sampling_repeats():
    logits, params = _logits(), SamplingParams(max_tokens=1, temperature=1.0)
    draws = [[sampler.sample(logits, params, g) for _ in range(20)]
             for g in (sampler.new_generator(42), sampler.new_generator(42))]
    assert draws[0] == draws[1]
    assert len(set(draws[0])) > 1


def test_top_k_and_top_p_only_draw_allowed_tokens():
    logits = _logits(3)
    top5 = set(torch.topk(logits, 5).indices.tolist())
    generator = sampler.new_generator(0)
    drawn = {sampler.sample(logits, SamplingParams(1, top_k=5), generator) for _ in range(300)}
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
    drawn = {sampler.sample(logits, SamplingParams(1, top_p=0.6), generator) for _ in range(300)}
    assert drawn <= nucleus and len(drawn) > 1


def test_logprobs_match_log_softmax():
    logits = _logits(5)
    entry = sampler.token_logprob(logits, 7, num_top=3)
    reference = torch.log_softmax(logits.double(), -1)
    assert entry.logprob == pytest.approx(float(reference[7]), abs=1e-5)
    assert [i for i, _ in entry.top] == torch.topk(reference, 3).indices.tolist()

