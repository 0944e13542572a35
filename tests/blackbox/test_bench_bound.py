"""bench/edit_turns_bound.py's offline simulation of the shipped drafter and of its oracles,
on a few tokens and a made-up step cost: no model."""
import sys

import pytest

from engined.engine import speculate
from tests.support.bench import BENCH, load

COST = (0.0, *(1e-3 * (1 + 0.1 * r) for r in range(speculate.K_MAX + 1)))  # a row: +10%


@pytest.fixture
def bound(monkeypatch):
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])  # the script's sibling imports
    return load("edit_turns_bound")


def test_a_copied_reply_takes_fewer_steps_than_tokens(bound):
    """The reply repeats the prompt: the shipped drafter's drafts stand, and the oracles',
    which know the coming tokens, too."""
    prompt = [7, 3, 9, 4, 1, 8, 2, 6, 5, 11, 12, 13, 14, 15]
    ref = prompt[1:]  # the first token drawn, then the rest of the copy
    seconds, steps, drafted, accepted = bound.shipped(prompt, ref, COST, speculate.Acceptance())
    assert accepted > 0 and steps < len(ref) - 1
    assert seconds < COST[1] * (len(ref) - 1)  # faster than plain decoding
    for context in (3, 2, 1):
        assert bound.oracle(prompt, ref, COST, context) < COST[1] * (len(ref) - 1)
