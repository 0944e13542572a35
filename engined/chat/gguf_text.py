"""The text half of a GGUF: vocabulary, merges, special ids and chat template.

GGUFReader parses every metadata array element into its own numpy view, which takes
about 1.8 s for SmolLM2's 49152 tokens + 48900 merges on the 2-core CI machine
(measured: `python -m engined.chat.gguf_text PATH`). The finished tokenizer.json plus
the few scalar fields therefore go to a small cache file, which loads in ~0.1 s.
The cache key is the GGUF's resolved path, size and mtime plus CACHE_VERSION.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import sys
import time

from engined.config import cache_dir

log = logging.getLogger(__name__)

CACHE_VERSION = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


@dataclasses.dataclass(frozen=True)
class GGUFText:
    model: str                    # tokenizer.ggml.model, e.g. "gpt2"
    pre: str                      # tokenizer.ggml.pre, e.g. "smollm"
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None


def _scalar(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    part = field.parts[field.data[0]]
    if field.types[0].name == "STRING":
        return bytes(part).decode("utf-8")
    return part[0].item()


def _strings(reader, key: str) -> tuple[str, ...]:
    field = reader.fields.get(key)
    if field is None:
        return ()
    return tuple(bytes(field.parts[i]).decode("utf-8") for i in field.data)


def _ints(reader, key: str) -> tuple[int, ...]:
    field = reader.fields.get(key)
    if field is None:
        return ()
    return tuple(int(field.parts[i][0]) for i in field.data)


def read_gguf_text(path: pathlib.Path) -> GGUFText:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    model = _scalar(reader, "tokenizer.ggml.model")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    eos = _scalar(reader, "tokenizer.ggml.eos_token_id")
    if model is None or not tokens or eos is None:
        raise ValueError(f"{path}: no tokenizer metadata (tokenizer.ggml.model/tokens/eos_token_id)")
    add_bos = _scalar(reader, "tokenizer.ggml.add_bos_token")
    return GGUFText(
        model=model, pre=_scalar(reader, "tokenizer.ggml.pre") or "default",
        tokens=tokens, token_types=_ints(reader, "tokenizer.ggml.token_type"),
        merges=_strings(reader, "tokenizer.ggml.merges"),
        bos_id=_scalar(reader, "tokenizer.ggml.bos_token_id"), eos_id=eos,
        unk_id=_scalar(reader, "tokenizer.ggml.unknown_token_id"),
        pad_id=_scalar(reader, "tokenizer.ggml.padding_token_id"),
        add_bos=bool(add_bos) if add_bos is not None else False,
        chat_template=_scalar(reader, "tokenizer.chat_template"))


def cache_path(gguf_path: pathlib.Path) -> pathlib.Path:
    resolved = gguf_path.resolve()
    stat = resolved.stat()
    key = f"{CACHE_VERSION}\0{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_dir() / "text" / f"{digest}.json"


def load_cached(path: pathlib.Path) -> dict | None:
    try:
        bundle = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(bundle, dict) or bundle.get("version") != CACHE_VERSION:
        return None
    return bundle


def store_cached(path: pathlib.Path, bundle: dict) -> None:
    """Atomic write; a read-only or full cache only costs the next start its 1.8 s."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(bundle, version=CACHE_VERSION)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("tokenizer cache not written to %s: %s", path, exc)


if __name__ == "__main__":  # measure the uncached read: python -m engined.chat.gguf_text PATH
    start = time.perf_counter()
    text = read_gguf_text(pathlib.Path(sys.argv[1]))
    print(f"read {len(text.tokens)} tokens, {len(text.merges)} merges "
          f"in {time.perf_counter() - start:.2f} s")
