"""bench/edit_turns.py's --context N (bench/edit_turns_bound.py's too): every turn opens with
the first N tokens of bench/quality.py's frozen text, an agent's depth of context, in its system
message; the turn's own messages follow unchanged."""
import importlib.util
import sys

import pytest

from engined.chat import load_text
from engined.weights.default_model import default_gguf_path
from tests.support.bench import BENCH

HEADER = "Files you have read:\n"


@pytest.fixture
def edit_turns(monkeypatch):
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])  # the script's sibling imports
    spec = importlib.util.spec_from_file_location("bench_edit_turns_context", BENCH / "edit_turns.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_context_opens_every_turn_with_the_frozen_texts_first_tokens(edit_turns):
    tokenizer, _ = load_text(default_gguf_path())
    text = (BENCH / "quality_text.txt").read_text()
    want = tokenizer.decode(tokenizer.encode(text)[:300])
    assert len(want) > 600 and text.startswith(want)
    plain, deep = edit_turns.frozen_turns(), edit_turns.frozen_turns(300)
    assert len(plain) == len(deep) == 25
    for turn, with_context in zip(plain, deep):
        own, got = turn["messages"], with_context["messages"]
        if own[0]["role"] != "system":  # the prose turns: a system message of the context alone
            own = [{"role": "system", "content": ""}, *own]
        assert got[0]["role"] == "system"
        assert got[0]["content"] == f"{HEADER}{want}\n\n{own[0]['content']}"
        assert got[1:] == own[1:] and with_context["kind"] == turn["kind"]


def test_a_context_the_text_cannot_give_is_refused_before_any_engine(edit_turns):
    with pytest.raises(SystemExit, match="give 0 or more tokens"):
        edit_turns.frozen_turns(-1)
    with pytest.raises(SystemExit, match=r"--context 100000: the frozen text has \d+ tokens"):
        edit_turns.frozen_turns(100_000)
