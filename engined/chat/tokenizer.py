"""Byte-level BPE tokenizer built from GGUF metadata with the `tokenizers` library.

The pre-tokenizer follows llama.cpp's table (src/llama-vocab.cpp, `regex_exprs` per
`tokenizer.ggml.pre`): the text is split by each regex in turn, every match isolated,
then bytes are mapped to GPT-2's printable alphabet. "smollm" (shared with starcoder,
refact, codeshell) first isolates every digit (`\\p{N}`), then applies GPT-2's split.
HF's SmolLM2 tokenizer.json says the same: Digits(individual_digits) + ByteLevel.

Control tokens (<|im_start|>, <|im_end|>, <|endoftext|>, ...) are added as special
tokens, so they match atomically; user-defined tokens are added as plain added tokens.

`encode(text, limit=N)` never tokenizes all of a text far over N tokens: every token stands
for at most `longest_token_bytes` bytes, so a text of B bytes has at least
ceil(B / longest) tokens and is refused before any work; below that floor the text is
encoded piece by piece (cut where every GPT-2 split cuts anyway, so the ids equal one
whole encode) and refused once past N. Pieces go through `encode_batch`, which releases the
GIL, so other requests' threads keep running meanwhile.
"""
from __future__ import annotations

import codecs
import math
import re
import threading

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from engined.chat.errors import ChatInputError, PromptTooLong, UnsupportedTokenizer
from engined.chat.gguf_text import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, GGUFText

PIECE_CHARS = 16_384  # text per encode call: a limit is noticed within one piece of it
# "letter|space letter": GPT-2's split ends a letter run before the space and starts
# " ?\p{L}+" at it, whatever comes before or after, so a piece ending here encodes alike.
_CUT = re.compile(r"[A-Za-z](?= [A-Za-z])")
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

PRE_TOKENIZER_SPLITS = {
    "smollm": (r"\p{N}", GPT2_SPLIT),
    "starcoder": (r"\p{N}", GPT2_SPLIT),
    "refact": (r"\p{N}", GPT2_SPLIT),
    "codeshell": (r"\p{N}", GPT2_SPLIT),
    "gpt2": (GPT2_SPLIT,),
    "mpt": (GPT2_SPLIT,),
    "olmo": (GPT2_SPLIT,),
}


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's printable spelling of each byte, inverted: char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    spelling = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + shifted)
            shifted += 1
    return {char: b for b, char in spelling.items()}


def build_backend(text: GGUFText) -> tokenizers.Tokenizer:
    if text.model != "gpt2":
        raise UnsupportedTokenizer(f"tokenizer.ggml.model {text.model!r}: only byte-level BPE ('gpt2') is built")
    splits = PRE_TOKENIZER_SPLITS.get(text.pre)
    if splits is None:
        raise UnsupportedTokenizer(
            f"tokenizer.ggml.pre {text.pre!r} is not known; known: {sorted(PRE_TOKENIZER_SPLITS)}")
    vocab = {token: i for i, token in enumerate(text.tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in text.merges]
    backend = tokenizers.Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    types = text.token_types or (1,) * len(text.tokens)
    backend.add_special_tokens([AddedToken(tok, special=True, normalized=False)
                                for tok, kind in zip(text.tokens, types) if kind == TOKEN_TYPE_CONTROL])
    backend.add_tokens([AddedToken(tok, special=False, normalized=False)
                        for tok, kind in zip(text.tokens, types) if kind == TOKEN_TYPE_USER_DEFINED])
    return backend


class Tokenizer:
    def __init__(self, backend: tokenizers.Tokenizer, bos_id: int | None, eos_id: int,
                 special_ids: frozenset[int], add_bos: bool = False):
        self._backend = backend
        self._plain_backend: tokenizers.Tokenizer | None = None  # special tokens read as text
        self._lock = threading.Lock()
        self._token_bytes: list[bytes] | None = None
        self._longest: int | None = None
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.special_ids = special_ids
        self.add_bos_token = add_bos
        added = backend.get_added_tokens_decoder().values()
        # An added token that holds a space, or strips or bounds itself, could span a cut.
        self._can_cut = not any(" " in t.content or t.lstrip or t.rstrip or t.single_word
                                for t in added)
        # Bytes with no token of their own (0xc0, 0xff, some controls) may be in no token.
        self._uncovered = bytes(b for c, b in _byte_alphabet().items()
                                if backend.token_to_id(c) is None)

    @classmethod
    def from_gguf_text(cls, text: GGUFText) -> "Tokenizer":
        special = frozenset(i for i, kind in enumerate(text.token_types) if kind == TOKEN_TYPE_CONTROL)
        return cls(build_backend(text), text.bos_id, text.eos_id, special, text.add_bos)

    def to_json(self) -> str:
        return self._backend.to_str()

    def encode(self, text: str, allow_special: bool = True, add_bos: bool = False,
               limit: int | None = None) -> list[int]:
        """Token ids of `text`. With allow_special=False, "<|im_end|>" in user text is plain text.
        add_bos prepends BOS (callers pass `add_bos_token` for raw prompts; chat templates write their own).
        With a limit, more ids than that raise PromptTooLong, usually long before the end."""
        if not isinstance(text, str):
            raise ChatInputError(f"text to tokenize must be a string, got {type(text).__name__}")
        ids = [self.bos_id] if add_bos and self.bos_id is not None else []
        if limit is not None and len(ids) + self.min_tokens(text) > limit:
            raise PromptTooLong(len(ids) + self.min_tokens(text), limit)
        backend = self._backend if allow_special else self._plain()
        for piece in self._pieces(text):
            ids += backend.encode_batch([piece], add_special_tokens=False)[0].ids
            if limit is not None and len(ids) > limit:
                raise PromptTooLong(len(ids), limit)
        return ids

    def min_tokens(self, text: str) -> int:
        """A floor on the token count of `text`: each of its bytes that has a token is in
        one, and a token stands for at most `longest_token_bytes` bytes."""
        return math.ceil(covered_size(text, self._uncovered) / self.longest_token_bytes)

    @property
    def longest_token_bytes(self) -> int:
        if self._longest is None:
            self._longest = max(len(self.token_bytes(i)) for i in range(self.vocab_size))
        return self._longest

    def _pieces(self, text: str):
        """Cuts at _CUT points about every PIECE_CHARS; the rest whole if none is left."""
        start = 0
        while self._can_cut and len(text) - start > PIECE_CHARS:
            cut = _CUT.search(text, start + PIECE_CHARS)
            if cut is None:
                break
            yield text[start:cut.end()]
            start = cut.end()
        yield text[start:] if start else text

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        self._check_ids(ids)
        return self._backend.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, i: int) -> str:
        self._check_ids([i])
        return self._backend.id_to_token(i)

    def token_bytes(self, i: int) -> bytes:
        """The bytes token `i` stands for (a special token: its UTF-8 text)."""
        if self._token_bytes is None:
            self._token_bytes = self._build_token_bytes()
        return self._token_bytes[i]

    def _check_ids(self, ids) -> None:
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.vocab_size:
                raise ChatInputError(f"token id {i!r} is not in the vocabulary [0, {self.vocab_size})")

    def _plain(self) -> tokenizers.Tokenizer:
        with self._lock:
            if self._plain_backend is None:
                plain = tokenizers.Tokenizer.from_str(self._backend.to_str())
                plain.encode_special_tokens = True
                self._plain_backend = plain
            return self._plain_backend

    def _build_token_bytes(self) -> list[bytes]:
        alphabet = _byte_alphabet()
        added = self._backend.get_added_tokens_decoder()
        table = []
        for i in range(self.vocab_size):
            if i in added:
                table.append(added[i].content.encode("utf-8"))
                continue
            token = self._backend.id_to_token(i)
            table.append(bytes(alphabet[c] for c in token) if all(c in alphabet for c in token)
                         else token.encode("utf-8"))
        return table


def covered_size(text: str, uncovered: bytes) -> int:
    """The UTF-8 size of `text`, less its bytes that are in `uncovered`."""
    if text.isascii():
        return len(text) - sum(text.count(chr(b)) for b in uncovered if b < 0x80)
    data = text.encode("utf-8", "surrogatepass")
    return len(data) - sum(data.count(b) for b in uncovered)


class IncrementalDecoder:
    """Streaming decode: push one id at a time, get the text completed so far.

    Bytes of a character split across tokens wait in the UTF-8 decoder until complete;
    invalid bytes become U+FFFD exactly as a full decode would make them.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        tok = self._tokenizer
        tok._check_ids([token_id])
        if self._skip_special and token_id in tok.special_ids:
            return ""
        return self._utf8.decode(tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
