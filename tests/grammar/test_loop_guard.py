"""A JSON reply under a grammar that loops is closed at the grammar's first chance
(engined/grammar/loop_guard.py); before a loop, and without a JSON grammar, masks are the
grammar's own."""
import json

import jsonschema
import torch

from engined.grammar.loop_guard import LOOP_TOKENS, WINDOW, LoopGuard, closer_bitmasks
from engined.grammar.matcher import GrammarMatcher, unpack
from tests.support import bench
from tests.support.engine import post

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
          "additionalProperties": False}


def guard_of(closers=None, token_bytes=lambda t: b"x") -> LoopGuard:
    return LoopGuard(closers if closers is not None else torch.zeros(2, 1, dtype=torch.int32),
                     token_bytes)


def test_an_exact_loop_closes_only_once_it_is_long_enough():
    guard = guard_of()
    for i in range(LOOP_TOKENS - 1):   # a 2-token span: the tail repeats from its 3rd token
        guard.push(7 + i % 2)
    assert not guard.is_closing
    guard.push(7 + (LOOP_TOKENS - 1) % 2)
    assert guard.is_closing


def test_text_that_does_not_repeat_never_closes():
    guard = guard_of()
    for i in range(1000):
        guard.push((i * 7919) % 5003)
    assert not guard.is_closing


def test_a_near_repeat_closes_once_most_of_the_window_repeats():
    """A 16-token span whose last token counts up (`"label": "Question 1"}, ...`): 15 of 16
    tokens equal the one a span back, once the window holds no token from before the loop."""
    guard, first = guard_of(), None
    for i in range(2 * WINDOW):
        guard.push(1000 + i // 16 if i % 16 == 15 else i % 16)
        if guard.is_closing:
            first = i + 1
            break
    assert first is not None and WINDOW < first <= WINDOW + 16


def test_the_string_state_follows_quotes_and_escapes():
    pieces = [b'{"a": "', b'x\\"y', b'\\\\', b'"', b', "b": "', b'"}']
    guard = guard_of(token_bytes=lambda t: pieces[t])
    states = []
    for t in range(len(pieces)):
        guard.push(t)
        states.append(guard.in_string)
    assert states == [True, True, True, False, True, False]


def test_closers_are_the_tokens_that_only_close(smol_text):
    tokenizer, chat = smol_text
    table = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
    masks = closer_bitmasks(table, chat.stop_token_ids)
    allowed = unpack(masks, tokenizer.vocab_size, torch.device("cpu"))
    inside = {i for i in range(len(table)) if table[i][:1] == b'"' and set(table[i][1:]) <= set(b"]}")}
    outside = {i for i in range(len(table)) if table[i] and set(table[i]) <= set(b"]}")}
    assert set(allowed[0].nonzero().flatten().tolist()) == inside
    assert set(allowed[1].nonzero().flatten().tolist()) == outside | set(chat.stop_token_ids)
    quote, brace = tokenizer.encode('"'), tokenizer.encode("}")
    assert len(quote) == len(brace) == 1 and quote[0] in inside and brace[0] in outside
    assert brace[0] not in inside  # inside a string a brace is text


def allowed_texts(matcher, tokenizer) -> set[str]:
    bitmask, _, _ = matcher.mask()
    ids = unpack(bitmask, tokenizer.vocab_size, torch.device("cpu"))[0].nonzero().flatten().tolist()
    return {tokenizer.decode([i]) for i in ids}


def test_a_looping_string_is_closed_then_the_reply_ends(compiler, smol_text):
    tokenizer, chat = smol_text
    compiled = compiler.json_schema(SCHEMA)
    plain = GrammarMatcher(compiled, compiler.ll)
    guarded = GrammarMatcher(compiled, compiler.ll, closers=compiler.closers)
    loop = tokenizer.encode("Cron: " * 40)
    for token in tokenizer.encode('{"a": "') + loop[:LOOP_TOKENS // 2]:
        plain.advance(token)
        guarded.advance(token)
    assert allowed_texts(guarded, tokenizer) == allowed_texts(plain, tokenizer)  # no loop yet
    for token in loop[LOOP_TOKENS // 2:LOOP_TOKENS + 2]:
        guarded.advance(token)
    texts = allowed_texts(guarded, tokenizer)
    assert '"' in texts and '"}' in texts and all(t[:1] == '"' and set(t[1:]) <= set("]}") for t in texts)
    guarded.advance(tokenizer.encode('"}')[0] if len(tokenizer.encode('"}')) == 1 else tokenizer.encode('"')[0])
    assert guarded.guard.num_narrowed >= 1 and "grammar_loop_closed=1" in " ".join(guarded.log_fields())


def test_a_forced_call_that_loops_still_parses_served(served):
    """The frozen bench set's first prompt: greedy, SmolLM2 writes "Cron: Cron: ..." inside
    CronCreate's prompt for ever; under the guard the call closes well before max_tokens."""
    body = bench.load("structured_set").tool_prompts()[0]
    resp = post(served.sock, "/v1/chat/completions", {**body, "tool_choice": "required",
                                                      "max_tokens": 256, "temperature": 0}).json()
    assert resp["choices"][0]["finish_reason"] == "tool_calls", resp
    assert resp["usage"]["completion_tokens"] < 256
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    for call in resp["choices"][0]["message"]["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
    assert "grammar_loop_closed=" in (served.dir / "engine.log").read_text()
