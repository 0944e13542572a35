"""Text in and out of the model: tokenizer, chat template, tool rendering, output parsing.

    tokenizer, chat = load_text(gguf_path)
    prompt_ids = tokenizer.encode(chat.render(messages, tools))
    parser = OutputParser(tools_enabled=bool(tools))   # engined.chat.output
"""
from __future__ import annotations

import pathlib

import tokenizers

from engined.chat.errors import ChatInputError, UnsupportedTokenizer
from engined.chat.gguf_text import cache_path, load_cached, read_gguf_text, store_cached
from engined.chat.template import ChatFormat
from engined.chat.tokenizer import IncrementalDecoder, Tokenizer

__all__ = ["ChatFormat", "ChatInputError", "IncrementalDecoder", "Tokenizer", "UnsupportedTokenizer", "load_text"]


def _from_bundle(bundle: dict) -> tuple[Tokenizer, str | None] | None:
    try:
        backend = tokenizers.Tokenizer.from_str(bundle["tokenizer_json"])
        tokenizer = Tokenizer(backend, bundle["bos_id"], bundle["eos_id"],
                              frozenset(bundle["special_ids"]), bundle["add_bos"])
        return tokenizer, bundle["chat_template"]
    except Exception:  # noqa: BLE001 - a damaged cache (any parse error) is rebuilt, never fatal
        return None


def load_text(gguf_path: pathlib.Path) -> tuple[Tokenizer, ChatFormat]:
    """Tokenizer and chat format of a GGUF; the built tokenizer is cached (see gguf_text.py)."""
    gguf_path = pathlib.Path(gguf_path)
    cache = cache_path(gguf_path)
    bundle = load_cached(cache)
    loaded = _from_bundle(bundle) if bundle is not None else None
    if loaded is None:
        text = read_gguf_text(gguf_path)
        tokenizer = Tokenizer.from_gguf_text(text)
        store_cached(cache, {"tokenizer_json": tokenizer.to_json(), "bos_id": text.bos_id, "eos_id": text.eos_id,
                             "special_ids": sorted(tokenizer.special_ids), "add_bos": text.add_bos,
                             "chat_template": text.chat_template})
        loaded = tokenizer, text.chat_template
    tokenizer, template = loaded
    tokenizer.token_bytes(0)   # build the streaming byte table now (~0.1 s), not in the first request
    return tokenizer, ChatFormat(template, tokenizer)
