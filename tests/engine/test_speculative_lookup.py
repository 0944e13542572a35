"""PromptLookup: what a sequence's own context drafts (engined/engine/lookup.py)."""
from engined.engine import speculate
from engined.engine.lookup import NEAR_AFTER, WINDOW, PromptLookup


def test_lookup_takes_the_most_recent_longest_match():
    lookup = PromptLookup([5, 1, 2, 3, 9, 1, 2, 3, 4, 7, 2, 3])
    assert lookup.draft([], 3) == [4, 7, 2]  # "2 3" last seen before 4 (and "7 2 3" never)
    assert lookup.match == 2
    assert lookup.draft([4, 7, 2], 2) == [3, 4]  # output joins the context: "7 2" -> 3
    assert PromptLookup([1, 2]).draft([], 4) == []
    assert PromptLookup([8, 8]).draft([], 4) == [8]  # a token repeated


def test_a_longer_match_wins_and_says_how_long_it_was():
    """The suffix "1 2 3 4" picks the first copy, though "2 3 4" came last; a match of one
    token drafts as much as a long one, and `match` tells them apart."""
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 0, 1, 2, 3, 4])
    assert lookup.draft([], 4) == [5, 9, 2, 3]
    assert lookup.match == 4
    lookup = PromptLookup([7, 1, 2, 3, 4, 5, 8, 7])
    assert lookup.draft([], 4) == [1, 2, 3, 4] and lookup.match == 1
    lookup = PromptLookup([9, 7, 1, 2, 3, 4, 5, 8, 6, 7, 1, 2, 3, 4, 5, 8, 9, 7])
    assert lookup.draft([], 6) == [1, 2, 3, 4, 5, 8] and lookup.match == 2
    assert lookup.draft([1, 2, 3], 2) == [4, 5] and lookup.match == 5  # "9 7 1 2 3", not "6 7 ..."
    assert [speculate.match_bucket(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 32)] == \
        [0, 1, 2, 3, 3, 4, 4, 5, 5]


def test_after_a_substitution_the_copy_resumes_where_it_stopped():
    """An edit renames one word of code it copies: after the new word, the draft is the
    copy's next tokens, found by the last token just past where the copy stopped, not the
    last token's most recent occurrence anywhere."""
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 20, 13, 30, 31]  # 13 also at 9, before 30
    lookup = PromptLookup(prompt)
    assert lookup.draft([10, 11, 12], 4) == [13, 14, 15, 16]  # copying from position 3
    # the model wrote 99 there (an inserted word), then the copied 13
    assert lookup.draft([10, 11, 12, 99, 13], 3) == [14, 15, 16] and lookup.match == 1
    # none of that when no copy came before: the most recent occurrence
    assert PromptLookup(prompt).draft([99, 13], 2) == [30, 31]
    # nor far from where it stopped: the 13 at 9 is beyond the span, for a copy stopped at 3
    far = [10, 11, 12, *range(40, 40 + NEAR_AFTER), 13, 14, 21, 13, 21, 22]
    lookup = PromptLookup(far)
    assert lookup.draft([10, 11, 12], 2) == [40, 41]
    assert lookup.draft([10, 11, 12, 7, 13], 2) == [21, 22]  # the most recent "13"


def test_a_token_never_seen_reads_as_a_substitute():
    """A last token that never occurred (a new name, a deeper indent) is read as replacing the
    token after an earlier occurrence of the two before it: the draft is the copy past that
    token, from the occurrence whose match runs furthest back, with `match` 1."""
    prompt = [10, 11, 12, 13, 14, 15, 5, 12, 16, 17]  # 12 after "10 11" and after "5"
    lookup = PromptLookup(prompt)
    assert lookup.draft([10, 11, 12, 99], 3) == [14, 15, 5] and lookup.match == 1  # 99 for 13
    assert PromptLookup(prompt).draft([5, 12, 99], 2) == [17, 5]  # 99 for 16, after "5 12"
    assert PromptLookup(prompt).draft([99], 2) == []  # 17 came only just before 99
    # "7 12" never came: one token matched, as a new word after a common one in prose
    assert PromptLookup(prompt).draft([7, 12, 99], 2) == []


def test_a_prediction_is_looked_up_before_the_prompt():
    """OpenAI's Predicted Outputs: the prediction's tokens draft as the prompt's do; its end is
    not read as the reply's context (the prompt's end is)."""
    lookup = PromptLookup([1, 2, 3], prediction=(7, 8, 2, 3, 4, 5))
    assert lookup.draft([], 3) == [4, 5, 1]  # "2 3" was followed by 4 5 in the prediction
    # nothing matches "3 4" or "4", and no "3" came before to have had its next token replaced
    assert PromptLookup([1, 2, 3], prediction=(2, 5, 9)).draft([4], 2) == []
    assert PromptLookup([1, 2, 3], prediction=(3, 4, 6)).draft([4], 2) == [6, 1]
    long = PromptLookup([1, 2, 3], prediction=tuple(range(3 * WINDOW)))
    assert len(long.tokens) == WINDOW + 3  # indexed on the model thread: bounded
