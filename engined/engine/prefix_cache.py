"""Prefix cache: the per-position cache rows (Llama KV, Kimi-Linear MLA latents) and, for
recurrent models, state snapshots (Kimi-Linear's KDA state + conv windows), keyed by a hash
of the token prefix they follow, reused by later requests that start with the same tokens.

A warm cache never changes an answer. Prefill runs in chunks on a fixed grid (chunk k covers
positions [k*C, (k+1)*C) of every prompt, the last one shorter), and the cache keeps and
restores whole grid chunks only: one entry per completed chunk, with a state snapshot at its
end for recurrent models. So every prompt token a warm request computes is computed by the same
chunk, over the same keys, as in a cold run, and restored rows are the rows a cold run would
have computed: cold and warm agree bit for bit, not merely within rounding (a row computed in a
chunk of another length, or attending over a different key span, differs in the last bits,
and greedy decoding flips on near-ties). The price is reuse to the grid, at most C - 1 tokens
per request. Restores copy into the sequence's own tensors, never alias a snapshot (reference
§8, pitfall 2).

It works with any model cache (engined/models/protocol.py's Cache: models/llama.py KVCache,
models/kimi_linear.py KimiCache).
A byte budget with LRU eviction; every stored byte is reserved against the memory cap.
"""
import collections
import hashlib
from array import array
from dataclasses import dataclass

import torch

from engined.engine import memory

BLOCK = 256  # positions per entry: the engine's prefill chunk (the grid), loop.PREFILL_CHUNK


@dataclass
class Entry:
    start: int
    end: int
    rows: object  # the cache rows for positions [start, end)
    state: object  # recurrent state after position end - 1, or None
    nbytes: int


class PrefixKeys:
    """key(n) = hash of tokens[:n], for any n, in O(BLOCK) per key after one O(N) pass."""

    def __init__(self, tokens: list[int], block: int = BLOCK):
        self.tokens, self.block = tokens, block
        hasher, self._at_blocks = hashlib.blake2b(digest_size=16), [None]
        self._at_blocks[0] = hasher.copy()
        for begin in range(0, len(tokens) - len(tokens) % block, block):
            hasher.update(_bytes(tokens[begin:begin + block]))
            self._at_blocks.append(hasher.copy())

    def __len__(self) -> int:
        return len(self.tokens)

    def __call__(self, n: int) -> bytes:
        hasher = self._at_blocks[n // self.block].copy()
        if n % self.block:
            hasher.update(_bytes(self.tokens[n - n % self.block:n]))
        return hasher.digest()


def _bytes(tokens: list[int]) -> bytes:
    return array("q", tokens).tobytes()


def nbytes(obj) -> int:
    """Bytes of every tensor in obj (a tensor, or dicts/lists/dataclasses of them)."""
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return sum(nbytes(v) for v in vars(obj).values())


class PrefixCache:
    def __init__(self, budget_bytes: int, metrics=None, block: int = BLOCK):
        self.budget_bytes, self.metrics, self.block = budget_bytes, metrics, block
        self.entries: collections.OrderedDict[bytes, Entry] = collections.OrderedDict()
        self.num_bytes = 0

    @property
    def is_enabled(self) -> bool:
        return self.budget_bytes > 0

    def lookup(self, keys: PrefixKeys, limit: int, is_recurrent: bool) -> list[Entry]:
        """The entries to restore, in order, for the longest cached run of whole chunks from
        position 0, of at most `limit` tokens (a recurrent model needs a state at its end);
        [] on a miss."""
        chain = []
        for end in range(self.block, limit + 1, self.block):
            entry = self.entries.get(keys(end))
            if entry is None:
                break
            chain.append(entry)
        while chain and is_recurrent and chain[-1].state is None:
            chain.pop()
        return chain

    def restore(self, cache, keys: PrefixKeys, limit: int) -> int:
        """Copy the longest cached prefix (<= limit tokens) into `cache` -> its length."""
        if not self.is_enabled or limit <= 0:
            return 0
        found = self.lookup(keys, limit, cache.is_recurrent)
        if not found:
            return 0
        for entry in found:
            cache.write_rows(entry.start, entry.rows)
        cache.load_state(found[-1].state, found[-1].end)
        self.touch(keys, found[-1].end)
        return found[-1].end

    def store(self, cache, keys: PrefixKeys, first: int, num_computed: int):
        """After a prefill chunk over [first, num_computed): store the grid chunks it completed,
        with a snapshot at num_computed when that ends one. A prompt's last, partial chunk is
        not stored: a request that resumed after it would compute the next tokens in a chunk
        of another shape than a cold run does."""
        if not self.is_enabled:
            return
        aligned = num_computed - num_computed % self.block
        for end in range(first - first % self.block + self.block, aligned + 1, self.block):
            is_snapshot = end == num_computed and cache.is_recurrent
            self._insert(cache, keys(end), end - self.block, end, is_snapshot)
        self.touch(keys, num_computed)

    def touch(self, keys: PrefixKeys, num_tokens: int):
        """Most recent use: deepest entries first, so eviction trims a prefix from its end."""
        for end in reversed(range(self.block, num_tokens + 1, self.block)):
            key = keys(end)
            if key in self.entries:
                self.entries.move_to_end(key)

    def evict(self, num_bytes: int) -> int:
        """Free at least num_bytes, least recently used first -> bytes freed."""
        freed = 0
        while self.entries and freed < num_bytes:
            _, entry = self.entries.popitem(last=False)
            self._forget(entry)
            freed += entry.nbytes
            if self.metrics is not None:
                self.metrics.prefix_evictions.inc()
        return freed

    def clear(self):
        self.evict(self.num_bytes + 1)

    def _insert(self, cache, key: bytes, start: int, end: int, is_snapshot: bool):
        old = self.entries.get(key)
        if old is not None and (old.state is not None or not is_snapshot):
            return
        rows = old.rows if old is not None else cache.read_rows(start, end)
        state = cache.save_state() if is_snapshot else None
        if old is not None:
            self._forget(self.entries.pop(key))
        entry = Entry(start, end, rows, state, nbytes(rows) + nbytes(state))
        if not self._reserve(entry.nbytes):
            return
        self.entries[key] = entry
        self.num_bytes += entry.nbytes
        self._update_gauge()

    def _reserve(self, num_bytes: int) -> bool:
        """Make room within the budget and the memory cap; False when it cannot fit."""
        if num_bytes > self.budget_bytes:
            return False
        if self.num_bytes + num_bytes > self.budget_bytes:
            self.evict(self.num_bytes + num_bytes - self.budget_bytes)
        while True:
            try:
                memory.reserve(num_bytes)
                return True
            except memory.MemoryCapExceeded:
                if not self.entries:
                    return False
                self.evict(num_bytes)

    def _forget(self, entry: Entry):
        self.num_bytes -= entry.nbytes
        memory.release(entry.nbytes)
        self._update_gauge()

    def _update_gauge(self):
        if self.metrics is not None:
            self.metrics.prefix_cache_bytes.set(self.num_bytes)
