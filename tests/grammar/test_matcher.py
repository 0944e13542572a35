"""The mask meets the logits: bit unpacking against a plain loop, rows without a grammar left
alone, a padded vocabulary's extra ids forbidden, and the mask of step t+1 made off the thread."""
import torch

from engined.grammar.matcher import GrammarMatcher, masked, unpack


def naive_unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.zeros(bitmask.shape[0], vocab, dtype=torch.bool)
    for r in range(bitmask.shape[0]):
        for token in range(min(vocab, 32 * bitmask.shape[1])):
            out[r, token] = bool((int(bitmask[r, token // 32]) >> (token % 32)) & 1)
    return out


def test_unpack_matches_a_plain_loop_on_awkward_widths():
    g = torch.Generator().manual_seed(0)
    for rows, words, vocab in ((1, 1, 1), (1, 1, 32), (2, 3, 70), (3, 2, 64), (1, 2, 100)):
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)
        assert torch.equal(unpack(bitmask, vocab, torch.device("cpu")), naive_unpack(bitmask, vocab))


class Fixed:
    """A stand-in matcher whose mask allows exactly `allowed`."""
    is_masking, is_failed = True, False

    def __init__(self, allowed: list[int], vocab: int):
        self.bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
        for token in allowed:
            self.bitmask[0, token // 32] |= torch.tensor(1 << (token % 32)).to(torch.int32)

    def mask(self):
        return self.bitmask, 0.1, True


def test_masked_rows_only_and_the_input_untouched():
    logits = torch.randn(3, 40)
    before = logits.clone()
    seen = []
    out = masked(logits, [None, Fixed([3, 33], 40), None], lambda ms, ready: seen.append(ready))
    assert torch.equal(logits, before)
    assert torch.equal(out[0], before[0]) and torch.equal(out[2], before[2])
    assert out[1].isfinite().nonzero().flatten().tolist() == [3, 33]
    assert seen == [True]
    assert masked(logits, [None, None, None]) is logits


def test_a_padded_vocabulary_never_allows_its_extra_ids():
    out = masked(torch.zeros(1, 70), [Fixed(list(range(64)), 64)])   # model V 70 > 64 tokens
    assert out[0, :64].isfinite().all() and not out[0, 64:].isfinite().any()


def test_the_next_mask_is_computed_on_the_grammar_thread(compiler, smol_text):
    import threading
    tokenizer, chat = smol_text
    matcher = GrammarMatcher(compiler.choice(["yes", "no"]), compiler.ll)
    threads, fill = [], matcher._fill

    def spy(*consumed):
        threads.append(threading.current_thread().name)
        fill(*consumed)

    matcher.mask()
    matcher._fill = spy
    first = tokenizer.encode("yes")[0]
    matcher.advance(first)
    bitmask, ms, _ = matcher.mask()
    assert threads == ["kimi-grammar_0"] and ms >= 0
    rest = "yes"[len(tokenizer.decode([first])):]
    allowed = unpack(bitmask, tokenizer.vocab_size, torch.device("cpu"))[0].nonzero().flatten().tolist()
    assert allowed
    for token in allowed:
        text = tokenizer.decode([token])
        assert (text and rest.startswith(text)) or (not rest and token in chat.stop_token_ids)


def test_a_grammar_in_error_draws_freely_instead_of_from_an_empty_mask(compiler, smol_text):
    tokenizer, _ = smol_text
    lines = []
    matcher = GrammarMatcher(compiler.choice(["yes", "no"]), compiler.ll, log=lines.append)
    matcher.mask()
    matcher.matcher.consume_token(tokenizer.encode("maybe")[0])   # the matcher errs (a limit, say)
    logits = torch.randn(1, tokenizer.vocab_size)
    assert masked(logits, [matcher]) is logits
    assert matcher.is_failed and not matcher.is_masking and lines


def test_a_forbidden_nan_logit_is_never_drawn(compiler):
    """The CPU masking (a lookup and fmin) sends a NaN on a forbidden token to -inf, as the
    GPU's masked_fill does: the masked argmax is an allowed token."""
    matcher = GrammarMatcher(compiler.choice(["yes", "no"]), compiler.ll)
    bitmask, _, _ = matcher.mask()
    allowed = unpack(bitmask, compiler.ll.vocab_size, torch.device("cpu"))[0]
    logits = torch.zeros(1, compiler.ll.vocab_size)
    forbidden = int((~allowed).nonzero()[0])
    logits[0, forbidden] = float("nan")
    out = masked(logits, [matcher])
    assert bool(allowed[int(out.argmax())]) and out[0, forbidden] == float("-inf")
