"""encode(text, limit=N): a text far over N tokens is refused from its size alone, one below
that floor is encoded in pieces that give exactly the ids of one whole encode, and a text
that fits is never refused."""
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engined.chat import tokenizer as tokenizer_mod
from engined.chat.errors import PromptTooLong
from engined.chat.kimi_tokenizer import KimiTokenizer
from tests.support import kimi_tiny

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
texts = st.lists(st.sampled_from(list("ab Zé 7\n\t.,'s") + [" the", "<|im_end|>", "東京", "  ",
                                                             "'t ", "\r\n", "😀", "x y", "\x04",
                                                             "\U00040000", "\xff"]),
                 max_size=40).map("".join) | st.text(max_size=40)


@pytest.fixture(scope="module")
def tok(default_gguf, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "engine-cache"))
        from engined.chat import load_text

        return load_text(default_gguf)[0]


@pytest.fixture(scope="module")
def kimi():
    ranks = {b: i for i, b in enumerate(kimi_tiny.bpe_ranks())}
    return KimiTokenizer(ranks, {}, None, None)


@SETTINGS
@given(text=texts, allow_special=st.booleans())
def test_pieces_encode_like_the_whole_text(tok, monkeypatch, text, allow_special):
    monkeypatch.setattr(tokenizer_mod, "PIECE_CHARS", 3)  # a cut at every chance
    backend = tok._backend if allow_special else tok._plain()
    assert tok.encode(text, allow_special) == backend.encode(text, add_special_tokens=False).ids
    assert tok.min_tokens(text) <= len(tok.encode(text, allow_special))


@SETTINGS
@given(text=texts)
def test_kimi_floor_is_a_floor(kimi, text):
    assert kimi.min_tokens(text) <= len(kimi.encode(text))


@pytest.mark.parametrize("which", ["tok", "kimi"])
def test_a_text_that_fits_is_never_refused(request, which):
    t = request.getfixturevalue(which)
    text = "The quick brown fox jumps over the lazy dog. " * 400
    count = len(t.encode(text))
    assert t.encode(text, limit=count) == t.encode(text)
    with pytest.raises(PromptTooLong) as refused:
        t.encode(text, limit=count - 1)
    assert count - 1 < refused.value.num_tokens <= count


@pytest.mark.parametrize("which", ["tok", "kimi"])
def test_a_huge_text_is_refused_without_tokenizing_it(request, which):
    t = request.getfixturevalue(which)
    text = "The quick brown fox jumps over the lazy dog. " * (16 * 2**20 // 45)  # 16 MiB
    start = time.monotonic()
    with pytest.raises(PromptTooLong) as refused:
        t.encode(text, limit=4096)
    assert time.monotonic() - start < 0.5  # a whole encode takes about 15 s here
    assert refused.value.num_tokens == t.min_tokens(text) > 4096


def test_past_the_floor_encoding_stops_at_the_limit(tok, monkeypatch):
    """One letter per token: the floor (size / longest token) allows it, so it is encoded,
    but only up to the first piece past the limit."""
    pieces = []
    real = tok._pieces
    monkeypatch.setattr(tok, "_pieces", lambda text: (pieces.append(p) or p for p in real(text)))
    text = "a b " * 100_000
    with pytest.raises(PromptTooLong):
        tok.encode(text, limit=len(text) // tok.longest_token_bytes + 10)
    assert sum(map(len, pieces)) < len(text) // 4
