"""Grammar sources -> compiled llguidance matchers, cached by a hash of their source.

One Compiler per loaded model: it builds the llguidance tokenizer once (~0.2 s for 49k
tokens) from the engine's own token table, so masks index the model's ids. JSON schemas
compile leniently (unknown keywords and formats are ignored and logged, never refused) with
fixed separators `, ` and `: ` and no free whitespace, so a small model cannot pad a reply
with blank lines. A source that does not compile raises GrammarError naming the path of
the smallest failing subschema; the HTTP side turns that into a 400.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import llguidance as llg

from engined.grammar.loop_guard import closer_bitmasks
from engined.grammar.strict import SCHEMA_KEYS, SCHEMA_LIST_KEYS, SUBSCHEMA_KEYS

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                "lenient": True}
CACHE_SIZE = 256  # compiled grammars kept (a Claude Code request brings ~25 tool schemas)


class GrammarError(ValueError):
    """A grammar source that does not compile; `path` locates it inside a JSON schema."""

    def __init__(self, message: str, path: str = ""):
        super().__init__(f"{path}: {message}" if path else message)
        self.message, self.path = message, path  # llguidance's reason; where it failed


@dataclass(frozen=True)
class Compiled:
    """A compiled grammar: matchers for requests are deep copies of `prototype`."""
    key: str
    prototype: llg.LLMatcher
    warnings: tuple[str, ...]
    compile_ms: float

    def new_matcher(self) -> llg.LLMatcher:
        return self.prototype.deep_copy()


def ll_tokenizer(tokenizer, stop_token_ids) -> llg.LLTokenizer:
    """An llguidance tokenizer over the engine tokenizer's own byte table (both the GGUF
    tokenizer and Kimi's tiktoken one offer token_bytes/encode/special_ids); the stop ids
    are its end tokens, allowed once a grammar is complete."""
    wrapper = llg.TokenizerWrapper(_TokenTable(tokenizer))
    return llg.LLTokenizer(wrapper, n_vocab=tokenizer.vocab_size,
                           eos_token=sorted(stop_token_ids) or [tokenizer.eos_id])


class _TokenTable:
    """What llguidance.TokenizerWrapper reads from a tokenizer."""

    def __init__(self, tokenizer):
        self.eos_token_id, self.bos_token_id = tokenizer.eos_id, tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(tokenizer.special_ids)
        self._tokenizer = tokenizer

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, allow_special=False)


class Compiler:
    def __init__(self, tokenizer, stop_token_ids=(), log=print):
        self.tokenizer = tokenizer
        self.ll = ll_tokenizer(tokenizer, stop_token_ids)
        self.closers = closer_bitmasks([tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)],
                                       frozenset(stop_token_ids) or {tokenizer.eos_id})
        self.log = log
        self._cache: OrderedDict[str, Compiled] = OrderedDict()
        self._lock = threading.Lock()
        self.on_compile = lambda seconds: None  # metrics hook: compile time of a cache miss

    def json_schema(self, schema, where: str = "schema") -> Compiled:
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, dict):
            raise GrammarError("a schema must be a JSON object", where)
        try:
            source = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise GrammarError(str(exc), where) from None
        try:
            return self.grammar(source)
        except GrammarError as exc:
            path = failing_path(schema, self._schema_error, where)
            raise GrammarError(exc.message, path) from None

    def regex(self, pattern: str) -> Compiled:
        return self.grammar(llg.LLMatcher.grammar_from_regex(pattern))

    def lark(self, text: str) -> Compiled:
        return self.grammar(llg.LLMatcher.grammar_from_lark(text))

    def choice(self, options: list[str]) -> Compiled:
        return self.lark("start: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options))

    def grammar(self, source: str) -> Compiled:
        """llguidance grammar text (Lark, or its JSON form) -> Compiled, from the cache if seen."""
        key = hashlib.sha256(source.encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        started = time.perf_counter()
        prototype = llg.LLMatcher(self.ll, source, log_level=0)
        if prototype.is_error():
            raise GrammarError(prototype.get_error().strip())
        seconds = time.perf_counter() - started
        compiled = Compiled(key, prototype, tuple(prototype.get_grammar_warnings()), seconds * 1e3)
        if compiled.warnings:
            self.log(f"kimi-engine: grammar compiled with ignored parts: {'; '.join(compiled.warnings)}")
        self.on_compile(seconds)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _schema_error(self, schema: dict) -> str:
        source = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(source, self.ll)
        return messages[0] if is_error else ""


def failing_path(root: dict, error_of, where: str) -> str:
    """The path of the deepest subschema that fails on its own (with the root's $defs and
    definitions beside it, so its $refs resolve), else `where` itself."""
    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}

    def search(schema, path: str) -> str | None:
        for child, child_path in _children(schema, path):
            if isinstance(child, dict) and error_of({**defs, **child}):
                return search(child, child_path) or child_path
        return None

    return search(root, where) or where


def _children(schema, path: str):
    if not isinstance(schema, dict):
        return
    for key in SUBSCHEMA_KEYS:
        if isinstance(schema.get(key), dict):
            for name, child in schema[key].items():
                yield child, f"{path}.{key}.{name}"
    for key in SCHEMA_LIST_KEYS:
        if isinstance(schema.get(key), list):
            for i, child in enumerate(schema[key]):
                yield child, f"{path}.{key}[{i}]"
    for key in SCHEMA_KEYS:
        if isinstance(schema.get(key), dict):
            yield schema[key], f"{path}.{key}"
