"""Speculation under a grammar (GrammarMatcher.accepted_draft, draft_rows): each verify row is
masked exactly as the token-by-token decode masks that position, loop guard and budget
included, and the matcher is where it was after; an asleep lazy grammar drafts only the
tokens before the one that wakes it."""
import torch

from engined.grammar.closing import closing_texts
from engined.grammar.matcher import GrammarMatcher, Trigger
from proxy.dialects.freeform import input_schema

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}},
          "required": ["items"], "additionalProperties": False}


def new(compiler, schema, budget):
    return GrammarMatcher(compiler.json_schema(schema), compiler.ll, closers=compiler.closers,
                          budget=budget, closing_texts=tuple(closing_texts(schema)))


def sequential_masks(compiler, schema, budget, head, draft) -> list[torch.Tensor]:
    matcher = new(compiler, schema, budget)
    for token in head:
        matcher.advance(token)
    masks = [matcher.mask()[0].clone()]
    for token in draft:
        matcher.advance(token)
        masks.append(matcher.mask()[0].clone())
    return masks


def check_rows(compiler, tokenizer, schema, budget, head_text, draft_text):
    head, draft = tokenizer.encode(head_text), tokenizer.encode(draft_text)
    matcher = new(compiler, schema, budget)
    for token in head:
        matcher.advance(token)
    assert matcher.accepted_draft(draft) == draft
    rows = matcher.draft_rows(draft)
    expected = sequential_masks(compiler, schema, budget, head, draft)
    assert len(rows) == len(draft) + 1
    for j, (row, mask) in enumerate(zip(rows, expected)):
        assert torch.equal(row.mask()[0], mask), f"row {j}"
    for token, mask in zip(draft, expected[1:]):  # rolled back, guard untouched: the decode
        matcher.advance(token)                    # that accepts the draft masks the same
        assert torch.equal(matcher.mask()[0], mask)
    return rows, expected


def test_rows_match_the_token_by_token_masks(compiler, smol_text):
    tokenizer, _ = smol_text
    check_rows(compiler, tokenizer, SCHEMA, 400, '{"items": ["Baking", "Bak', 'ing", "Baking", "Baking"')


def test_rows_match_through_the_budget_closing(compiler, smol_text):
    """A budget of 40: the reserve (10 tokens) begins inside the draft, so later rows narrow."""
    tokenizer, _ = smol_text
    head = '{"items": ["a", "b", "c", "d", "e", "f", "g'
    rows, expected = check_rows(compiler, tokenizer, SCHEMA, 40, head, '", "h", "i", "j", "k"')
    assert not torch.equal(expected[-1], sequential_masks(compiler, SCHEMA, 400, tokenizer.encode(head),
                                                          tokenizer.encode('", "h", "i", "j", "k"'))[-1])


def test_rows_match_through_a_closing_text(compiler, smol_text, apply_patch):
    tokenizer, _ = smol_text
    schema = {"type": "object", "properties": {"input": input_schema(apply_patch["format"])},
              "required": ["input"], "additionalProperties": False}
    check_rows(compiler, tokenizer, schema, 48, '{"input": "*** Begin Patch\\n*** Add File: a.txt\\n+x',
               "yyyyyyyyyyyyyyyyyyyyyyyy")


def test_a_draft_is_cut_where_the_grammar_refuses_it(compiler, smol_text):
    tokenizer, _ = smol_text
    matcher = new(compiler, SCHEMA, 400)
    for token in tokenizer.encode('{"items": ["a"'):
        matcher.advance(token)
    good, bad = tokenizer.encode(', "b"'), tokenizer.encode("}")
    assert matcher.accepted_draft(good + bad + good) == good


def test_an_asleep_grammar_drafts_up_to_its_trigger(compiler, smol_text):
    tokenizer, _ = smol_text
    lazy = GrammarMatcher(compiler.json_schema(SCHEMA), compiler.ll, Trigger(text=b"<tool_call>"))
    for token in tokenizer.encode("Sure, here"):
        lazy.advance(token)
    draft = tokenizer.encode(" it is: <tool_call>\n{")
    cut = lazy.accepted_draft(draft)
    assert 0 < len(cut) < len(draft)
    assert "<tool_call>" not in tokenizer.decode(cut)
    assert "<tool_call>" in tokenizer.decode(draft[:len(cut) + 1])
    assert all(not row.is_masking for row in lazy.draft_rows(cut))


def test_a_draft_that_ends_the_reply_leaves_the_matcher_where_it_was(compiler, smol_text):
    """The prompt's end-of-turn token after a complete JSON: llguidance accepts it and stops
    without counting it; the rows before it match, and the decode goes on constrained."""
    tokenizer, chat = smol_text
    head, tail = tokenizer.encode('{"items": ["a", "b'), tokenizer.encode('"]}')
    draft = tail + [min(chat.stop_token_ids)]
    matcher = new(compiler, SCHEMA, 400)
    for token in head:
        matcher.advance(token)
    assert matcher.accepted_draft(draft) == draft
    rows = matcher.draft_rows(draft)
    expected = sequential_masks(compiler, SCHEMA, 400, head, tail)
    for row, mask in zip(rows, expected):
        assert torch.equal(row.mask()[0], mask)
    for token in tail:
        matcher.advance(token)
    assert matcher.is_masking and not matcher.is_failed
    assert torch.equal(matcher.mask()[0], expected[-1])


def test_draft_rows_are_not_timed_as_masks_computed_on_the_grammar_thread(compiler, smol_text):
    """The mask metrics (ms per mask, share ready before the logits) count the grammar
    thread's masks; a draft's rows are made ahead and would read as 0 ms, always ready."""
    from engined.grammar.matcher import masked
    tokenizer, _ = smol_text
    matcher = new(compiler, SCHEMA, 400)
    for token in tokenizer.encode('{"items": ["a'):
        matcher.advance(token)
    rows = matcher.draft_rows(tokenizer.encode('", "b'))
    seen = []
    masked(torch.zeros(len(rows), compiler.ll.vocab_size), rows, lambda ms, ready: seen.append(ms))
    assert seen == []
    masked(torch.zeros(1, compiler.ll.vocab_size), [matcher], lambda ms, ready: seen.append(ms))
    assert len(seen) == 1 and seen[0] >= 0.0
