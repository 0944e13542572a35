"""A JSON reply under a grammar closes before its max_tokens runs out (engined/grammar/
loop_guard.py), a pattern-constrained string through the literal tail its pattern ends with
(engined/grammar/closing.py): Codex's apply_patch input, judged by llguidance's own Lark parser
of Codex's definition, independent of the proxy's regex and of the closing."""
import json
import re

import jsonschema
import pytest
import torch

from engined.grammar.closing import closing_texts, literal_suffix
from engined.grammar.loop_guard import RESERVE
from engined.grammar.matcher import GrammarMatcher, unpack
from proxy.dialects.freeform import input_schema
from tests.grammar.conftest import lark_accepts
from tests.grammar.test_freeform import GOOD
from tests.support import bench
from tests.support.engine import post

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
          "additionalProperties": False}


def allowed_ids(matcher, vocab: int) -> list[int]:
    bitmask, _, _ = matcher.mask()
    return unpack(bitmask, vocab, torch.device("cpu"))[0].nonzero().flatten().tolist()


def rambling(matcher, tokenizer, stop_ids, prefix: str, filler: str, limit: int) -> list[int]:
    """A model that writes `prefix`, then `filler` whenever the mask allows it, else the
    lowest token id allowed, until a stop token or `limit` tokens."""
    out, fill = [], tokenizer.encode(filler)[0]
    planned = tokenizer.encode(prefix)
    while len(out) < limit:
        allowed = allowed_ids(matcher, tokenizer.vocab_size)
        token = planned.pop(0) if planned else fill if fill in allowed else allowed[0]
        assert token in allowed, (tokenizer.decode(out), tokenizer.decode([token]))
        out.append(token)
        if token in stop_ids:
            break
        matcher.advance(token)
    return out


def test_the_literal_tail_is_what_every_match_ends_with(apply_patch):
    pattern = input_schema(apply_patch["format"])["pattern"]
    tail = literal_suffix(pattern)
    assert tail == "*** End Patch"
    for text in GOOD:
        assert re.fullmatch(pattern, text) and text.rstrip("\n").endswith(tail)
    assert literal_suffix(r"^(?:[a-z]+)\.py$") == ".py"
    assert literal_suffix("a(b|c)") == "" and literal_suffix("(") == ""
    texts = closing_texts({"properties": {"p": {"type": "string", "pattern": pattern},
                                          "q": {"pattern": "x*"}}})
    assert texts[:2] == ["\n*** End Patch", "*** End Patch"] and "\n+\n*** End Patch" in texts
    assert all(t.endswith("*** End Patch") for t in texts)  # nothing from "x*"


def test_a_string_closes_within_the_budget_and_not_before(compiler, smol_text):
    tokenizer, chat = smol_text
    compiled = compiler.json_schema(SCHEMA)
    budget = 160  # its reserve: RESERVE tokens (a quarter of a smaller budget)
    plain = GrammarMatcher(compiled, compiler.ll)
    guarded = GrammarMatcher(compiled, compiler.ll, closers=compiler.closers, budget=budget)
    prefix = tokenizer.encode('{"a": "')
    words = tokenizer.encode(" ".join(f"w{i}" for i in range(200)))  # never a repeat
    written = prefix + words[:budget - RESERVE - 1 - len(prefix)]
    for token in written:
        plain.advance(token)
        guarded.advance(token)
        assert allowed_ids(guarded, tokenizer.vocab_size) == allowed_ids(plain, tokenizer.vocab_size)
    guarded.advance(words[len(written) - len(prefix)])  # RESERVE tokens left now
    assert not plain.mask()[0].equal(guarded.mask()[0])
    texts = {tokenizer.decode([i]) for i in allowed_ids(guarded, tokenizer.vocab_size)}
    assert '"' in texts and all(t[:1] == '"' and set(t[1:]) <= set("]}") for t in texts)
    assert "grammar_budget_closed=1" in " ".join(guarded.log_fields())


@pytest.mark.parametrize("prefix", [
    "*** Update File: a.py\\n@@\\n+print(",   # in a change line
    "*** Add File: 1.0.0",                       # in an added file's name: a + line is due
    "*** Add File: notes.txt\\n+hello\\n",      # at the start of a line
    "*** Delete File: old.py\\n*** Update File: b",
])
def test_an_apply_patch_that_runs_long_still_parses(compiler, smol_text, apply_patch, prefix):
    tokenizer, chat = smol_text
    schema = {"type": "object", "properties": {"input": input_schema(apply_patch["format"])},
              "required": ["input"], "additionalProperties": False}
    budget = 96
    matcher = GrammarMatcher(compiler.json_schema(schema), compiler.ll, closers=compiler.closers,
                             budget=budget, closing_texts=tuple(closing_texts(schema)))
    stop_ids = set(chat.stop_token_ids)
    out = rambling(matcher, tokenizer, stop_ids,
                   '{"input": "*** Begin Patch\\n' + prefix, "x", budget)
    text = tokenizer.decode([t for t in out if t not in stop_ids])
    assert len(out) <= budget and out[-1] in stop_ids, text
    patch = json.loads(text)["input"]
    assert lark_accepts(compiler, apply_patch["format"]["definition"], patch), patch
    assert patch.endswith("*** End Patch") and "xxxx" in patch


def test_forced_apply_patch_calls_parse_at_a_short_max_tokens_served(served, compiler, apply_patch):
    """The bench's apply_patch row in small: the first 3 edit prompts at 128 tokens, greedy."""
    structured_set = bench.load("structured_set")
    parameters = {"type": "object", "properties": {"input": input_schema(apply_patch["format"])},
                  "required": ["input"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "apply_patch", "parameters": parameters,
                                               "description": apply_patch["description"]}}]
    for edit in structured_set.EDITS[:3]:
        resp = post(served.sock, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": edit}], "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 128,
            "temperature": 0}).json()
        calls = resp["choices"][0]["message"].get("tool_calls")
        assert calls and resp["usage"]["completion_tokens"] <= 128, resp
        arguments = json.loads(calls[0]["function"]["arguments"])
        jsonschema.validate(arguments, parameters)
        assert lark_accepts(compiler, apply_patch["format"]["definition"], arguments["input"]), arguments


def test_an_optional_part_ends_the_literal_tail():
    assert literal_suffix("foo(?:x)?bar") == "bar" and literal_suffix("ab(?:c)*$") == "ab"


def test_a_closing_text_left_before_its_end_is_offered_again():
    """Only a text written to its end without closing is not offered again: another token
    in its place, even its own last token, leaves it available."""
    from engined.grammar.loop_guard import LoopGuard

    class Accepting:  # a grammar that accepts any closing text here
        @staticmethod
        def validate_tokens(tokens):
            return len(tokens)

    guard = LoopGuard(torch.zeros(2, 1, dtype=torch.int32), lambda t: b"x", plans=([5, 6, 7],))
    guard.is_closing = True

    def offered() -> list[int]:
        mask = torch.full((1, 1), -1, dtype=torch.int32)
        return [j for j in range(32) if int(mask[0, 0]) >> j & 1] if guard.narrow(mask, Accepting) else []

    assert offered() == [5]
    guard.push(5)
    assert offered() == [6]
    guard.push(7)              # not the planned 6: the plan is dropped, the text stays
    assert offered() == [5]
    for token in (5, 6, 7):    # written to its end: never again
        guard.push(token)
    assert offered() == []
