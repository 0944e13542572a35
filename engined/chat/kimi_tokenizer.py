"""Kimi tokenizer (reference §4.1-4.2): tiktoken BPE from `tiktoken.model` plus 256 reserved
special ids after the BPE ranks, named by tokenizer_config.json's added_tokens_decoder.

Same methods as engined.chat.tokenizer.Tokenizer, so IncrementalDecoder works unchanged.
"""
from __future__ import annotations

import json
import math
import pathlib
import re

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from engined.chat.errors import ChatInputError, PromptTooLong, UnsupportedTokenizer
from engined.chat.tokenizer import covered_size

NUM_RESERVED = 256
MAX_PIECE = 400_000   # Moonshot's guard rails: tiktoken can panic on huge inputs
MAX_RUN = 25_000
PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
_RUNS = re.compile(r"\s{1,%d}|\S{1,%d}" % (MAX_RUN, MAX_RUN))


def _pieces(text: str):
    """Cut text into <= MAX_PIECE chars at run boundaries; runs longer than MAX_RUN are split."""
    piece, size = [], 0
    for m in _RUNS.finditer(text):
        run = m.group()
        if size + len(run) > MAX_PIECE and piece:
            yield "".join(piece)
            piece, size = [], 0
        piece.append(run)
        size += len(run)
    if piece:
        yield "".join(piece)


class KimiTokenizer:
    def __init__(self, ranks: dict[bytes, int], names: dict[int, str], bos_token: str | None,
                 eos_token: str | None):
        num_bpe = len(ranks)
        if sorted(ranks.values()) != list(range(num_bpe)):
            raise UnsupportedTokenizer("tiktoken.model ranks must be 0..N-1 without gaps")
        specials = {names.get(i, f"<|reserved_token_{i}|>"): i
                    for i in range(num_bpe, num_bpe + NUM_RESERVED)}
        if len(specials) != NUM_RESERVED:
            raise UnsupportedTokenizer("tokenizer_config.json names two special ids alike")
        self._enc = tiktoken.Encoding("kimi", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)
        self._specials = specials
        self._bytes = [b""] * (num_bpe + NUM_RESERVED)
        for tok, i in ranks.items():
            self._bytes[i] = tok
        for name, i in specials.items():
            self._bytes[i] = name.encode()
        self.vocab_size = num_bpe + NUM_RESERVED
        self.special_ids = frozenset(specials.values())
        self.bos_id = specials.get(bos_token) if bos_token else None
        self.eos_id = specials.get(eos_token or "[EOS]")
        self.add_bos_token = False
        self.longest_token_bytes = max(len(b) for b in self._bytes)
        self._uncovered = bytes(b for b in range(256) if bytes([b]) not in ranks)

    @classmethod
    def from_dir(cls, path) -> "KimiTokenizer":
        path = pathlib.Path(path)
        model = path / "tiktoken.model"
        if not model.is_file():
            raise UnsupportedTokenizer(f"{path}: no tiktoken.model")
        try:
            ranks = load_tiktoken_bpe(str(model))
        except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
            raise UnsupportedTokenizer(f"{model}: not a tiktoken BPE file ({exc})") from None
        try:
            cfg = json.loads((path / "tokenizer_config.json").read_text())
        except FileNotFoundError:
            cfg = {}
        except json.JSONDecodeError as exc:
            raise UnsupportedTokenizer(f"{path}/tokenizer_config.json is not JSON ({exc})") from None
        names = {int(i): e["content"] for i, e in (cfg.get("added_tokens_decoder") or {}).items()}
        return cls(ranks, names, _token(cfg.get("bos_token")), _token(cfg.get("eos_token")))

    def encode(self, text: str, allow_special: bool = True, add_bos: bool = False,
               limit: int | None = None) -> list[int]:
        """Token ids; with allow_special=False a "<|im_end|>" in user text stays plain text.
        With a limit, more ids than that raise PromptTooLong: at once when the text's size
        alone says so, else after the piece that passes it (tiktoken releases the GIL)."""
        if not isinstance(text, str):
            raise ChatInputError(f"text to tokenize must be a string, got {type(text).__name__}")
        ids = [self.bos_id] if add_bos and self.bos_id is not None else []
        if limit is not None and len(ids) + self.min_tokens(text) > limit:
            raise PromptTooLong(len(ids) + self.min_tokens(text), limit)
        allowed = "all" if allow_special else set()
        for piece in _pieces(text):
            ids += self._enc.encode(piece, allowed_special=allowed, disallowed_special=())
            if limit is not None and len(ids) > limit:
                raise PromptTooLong(len(ids), limit)
        return ids

    def min_tokens(self, text: str) -> int:
        """A floor on the token count: each token is at most `longest_token_bytes` bytes."""
        return math.ceil(covered_size(text, self._uncovered) / self.longest_token_bytes)

    def decode(self, ids, skip_special: bool = False) -> str:
        self._check_ids(ids)
        data = b"".join(self._bytes[i] for i in ids if not (skip_special and i in self.special_ids))
        return data.decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        if token in self._specials:
            return self._specials[token]
        try:
            return self._enc.encode_single_token(token.encode())
        except KeyError:
            return None

    def id_to_token(self, i: int) -> str:
        self._check_ids([i])
        return self._bytes[i].decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        return self._bytes[i]

    def _check_ids(self, ids) -> None:
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.vocab_size:
                raise ChatInputError(f"token id {i!r} is not in the vocabulary [0, {self.vocab_size})")


def _token(value) -> str | None:
    """tokenizer_config token fields are a string or {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value
