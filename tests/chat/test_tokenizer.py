"""Tokenizer parity against a named reference: HF transformers' own GGUF tokenizer conversion.

transformers maps `tokenizer.ggml.pre = "smollm"` to no split of its own, so its reference
falls back to GPT-2's split, which does not isolate digits. llama.cpp (the file's writer) and
SmolLM2's published tokenizer.json both isolate every digit first. The two only disagree on a
whitespace run right before a digit ("a  1"): those texts are checked against the same
transformers conversion with SmolLM2's published pre-tokenizer put back
(Digits(individual_digits=True) + ByteLevel), built from `tokenizers`' Digits, not our regex.
"""
import random

import pytest
from tokenizers import pre_tokenizers

from engined.chat import ChatInputError, IncrementalDecoder, load_text
from engined.chat.gguf_text import cache_path

TEXTS = [
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog's back; it's 5 o'clock.",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot",
    "Le cœur a ses raisons que la raison ne connaît point. Ça va, très bien !",
    "Größenwahn, Straße und Übermäßigkeit: äöüß ÄÖÜ.",
    "我们的模型在本地运行，不需要网络。",
    "日本語のテキストをトークン化します。カタカナとひらがな。",
    "Emoji: 😀👍🏽🇫🇷 👨‍👩‍👧‍👦 ✨",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Привет, мир! Ελληνικά κείμενα.",
    "tabs\tand\t\tspaces    and\n\n\nnewlines \r\n end   ",
    "   leading spaces and trailing   ",
    "Numbers: 3.14159, 1,000,000 and -42 plus 2024-12-02T13:37:00Z, 0x1F.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>kimi<file_sep>a.py",
    "Mixed: naïve café 東京 😀 123 <tag attr=\"x\">",
    "",
]

DIGIT_AFTER_SPACE_RUN = ["a  1", "x\n\n2", "hello   42 world", "total:\t\t 3 items", "  7"]


@pytest.fixture(scope="module")
def ours(default_gguf, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mp.delenv("CACHE_DIRECTORY", raising=False)
        tokenizer, _ = load_text(default_gguf)
    return tokenizer


@pytest.fixture(scope="module")
def reference_smollm_split(reference):
    backend = reference.backend_tokenizer.__class__.from_str(reference.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return backend


def test_metadata(ours):
    assert ours.vocab_size == 49152
    assert (ours.bos_id, ours.eos_id) == (1, 2)
    assert ours.id_to_token(2) == "<|im_end|>" and ours.token_to_id("<|im_start|>") == 1
    assert ours.special_ids == frozenset(range(17))   # the 17 CONTROL tokens of SmolLM2
    assert ours.token_to_id("no-such-token-xyz") is None


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers_gguf_conversion(ours, reference, text):
    assert ours.encode(text) == reference.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS + DIGIT_AFTER_SPACE_RUN)
def test_ids_match_smollm_published_pretokenizer(ours, reference_smollm_split, text):
    assert ours.encode(text) == reference_smollm_split.encode(text, add_special_tokens=False).ids


def test_digits_are_isolated_after_space_runs(ours):
    # llama.cpp's smollm split: "\p{N}" first, so "a  " is its own piece and "  " one token.
    double_space = ours.token_to_id("ĠĠ")
    assert ours.encode("a  1") == [ours.token_to_id("a"), double_space, ours.token_to_id("1")]
    assert ours.encode("12345") == [ours.token_to_id(d) for d in "12345"]


def test_special_tokens_are_atomic_only_when_allowed(ours):
    text = "<|im_start|>user\nhi<|im_end|><|endoftext|>"
    ids = ours.encode(text)
    assert ids[0] == 1 and ids[-2:] == [2, 0]
    plain = ours.encode(text, allow_special=False)
    assert not set(plain) & ours.special_ids
    assert ours.decode(plain) == text


def test_add_bos(ours):
    assert ours.encode("hi", add_bos=True) == [1] + ours.encode("hi")


@pytest.mark.parametrize("text", TEXTS + DIGIT_AFTER_SPACE_RUN)
def test_decode_round_trip_and_matches_reference(ours, reference, text):
    ids = ours.encode(text)
    assert ours.decode(ids) == text
    assert ours.decode(ids) == reference.decode(ids, clean_up_tokenization_spaces=False)


def test_decode_skip_special(ours, reference):
    ids = ours.encode("<|im_start|>assistant\nBonjour 😀<|im_end|>")
    assert ours.decode(ids, skip_special=True) == "assistant\nBonjour 😀"
    assert ours.decode(ids, skip_special=True) == reference.decode(ids, skip_special_tokens=True)


def _stream(tokenizer, ids, skip_special=False) -> list[str]:
    decoder = IncrementalDecoder(tokenizer, skip_special=skip_special)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


@pytest.mark.parametrize("text", [t for t in TEXTS if any(ord(c) > 127 for c in t)])
def test_incremental_decoder_never_splits_a_character(ours, text):
    ids = ours.encode(text)
    pieces = _stream(ours, ids)
    assert "".join(pieces) == ours.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_incremental_decoder_holds_partial_characters(ours):
    """The emoji and CJK texts really do split characters across tokens, so holding is exercised."""
    for text in (TEXTS[6], TEXTS[8]):
        ids = ours.encode(text)
        pieces = _stream(ours, ids)
        assert "" in pieces[:-1] and "".join(pieces) == text
        assert any(len(ours.token_bytes(i)) and not piece for i, piece in zip(ids, pieces))


def test_incremental_decoder_skip_special(ours):
    ids = ours.encode("<|im_start|>assistant\nçà<|im_end|>")
    assert "".join(_stream(ours, ids, skip_special=True)) == ours.decode(ids, skip_special=True)


def test_incremental_decoder_matches_decode_on_invalid_utf8(ours):
    """Random ids, biased to single-byte tokens, make broken UTF-8; both paths replace it alike."""
    rng = random.Random(1234)
    byte_tokens = [i for i in range(ours.vocab_size) if len(ours.token_bytes(i)) == 1]
    assert len(byte_tokens) == 235   # SmolLM2 lacks 21 bytes: 6 C0 controls, C0/C1, F1/F2, F5..FF
    for _ in range(300):
        ids = [rng.choice(byte_tokens) for _ in range(rng.randrange(1, 8))] + [rng.randrange(ours.vocab_size)]
        assert "".join(_stream(ours, ids)) == ours.decode(ids)


@pytest.mark.parametrize("bad", [[-1], [49152], [1.5], ["3"], [True]])
def test_bad_ids_are_input_errors(ours, bad):
    with pytest.raises(ChatInputError, match="not in the vocabulary"):
        ours.decode(bad)
    with pytest.raises(ChatInputError):
        IncrementalDecoder(ours).push(bad[0])


def test_encode_rejects_non_string(ours):
    with pytest.raises(ChatInputError, match="must be a string"):
        ours.encode(None)


def test_cache_is_written_reused_and_rebuilt_when_damaged(default_gguf, ours, kimi_cache):
    tokenizer, _ = load_text(default_gguf)
    cached = cache_path(default_gguf)
    assert cached.is_file() and kimi_cache in cached.parents
    stamp = cached.stat().st_mtime_ns
    again, chat = load_text(default_gguf)
    assert cached.stat().st_mtime_ns == stamp, "a warm start must read the cache, not rewrite it"
    assert again.encode(TEXTS[16]) == tokenizer.encode(TEXTS[16]) == ours.encode(TEXTS[16])
    assert chat.stop_token_ids == frozenset({0, 2})
    cached.write_text("{ not json")
    rebuilt, _ = load_text(default_gguf)
    assert rebuilt.encode(TEXTS[8]) == ours.encode(TEXTS[8])
    assert cached.read_text().startswith("{\"tokenizer_json\"")
