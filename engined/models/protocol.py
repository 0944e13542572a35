"""The contract between the engine and a model family. Llama (models/llama.py) and
Kimi-Linear (models/kimi_linear.py) implement it, and so do the tests' stand-ins; the engine
and the prefix cache call these methods unconditionally, never probing what a model can do.

Letters: B sequences in a decode step, T prompt tokens, V vocabulary.
"""
from typing import Any, Protocol, runtime_checkable

import torch


class StaleGraphs(RuntimeError):
    """A graph step's captured addresses are no longer its tensors' (a pool was reallocated
    after capture): every graph of the model is stale, and decode runs eagerly from then on.
    Any other error of a step's load is that step's (its requests fail, as they would eagerly)."""


@runtime_checkable
class Cache(Protocol):
    """One sequence's cache: per-position rows (KV, latents) and, for recurrent models, state."""

    max_tokens: int
    is_recurrent: bool  # resuming needs a state snapshot, not rows alone

    def read_rows(self, start: int, end: int) -> Any:
        """A fresh copy of positions [start, end)."""

    def write_rows(self, start: int, rows: Any) -> None:
        """Copy rows read by read_rows back in at `start`."""

    def save_state(self) -> Any:
        """A fresh copy of the recurrent state after the last computed position (None: none)."""

    def load_state(self, state: Any, num_tokens: int) -> None:
        """Copy a saved state in; the sequence continues at position num_tokens."""


@runtime_checkable
class Model(Protocol):
    kv_bytes_per_token: int  # cache bytes one position adds
    state_bytes: int  # fixed bytes per sequence (recurrent state; 0 without); a speculating
    #                   sequence holds one more per draft (each verified row's state)
    weight_bytes: int
    decode_gemv: str  # the GEMV op the model chose for its decode rows ("": none chosen, each
    #                   linear resolves w4a16_gemv); logged with the CPU's kernels
    verifies_drafts: bool  # decode_batch rows may share one cache at consecutive positions,
    #                        each row bit for bit a lone decode step (speculative decoding)

    def new_cache(self, max_tokens: int) -> Cache:
        """An empty cache for one sequence of at most max_tokens positions."""

    def forward(self, tokens: torch.Tensor, cache: Cache, start: int,
                last_only: bool = True) -> torch.Tensor:
        """Prefill. tokens: [T] int64 at positions start.. -> logits fp32 [1, V] or [T, V]."""

    def decode_batch(self, tokens: torch.Tensor, caches: list[Cache],
                     positions: list[int]) -> torch.Tensor:
        """One token for each of B sequences. tokens: [B] int64; token i sits at
        positions[i] of caches[i] -> logits fp32 [B, V], each row equal to a lone forward."""

    def graph_step(self, rows: int, max_context: int) -> Any:
        """The decode step of `rows` rows in static device tensors, for CUDA graphs
        (engine/runner.py: load, load_scratch, segments, crossings, pieces, run, finish,
        logits; models/kimi_graph_step.py), its caches' memory reserved for sequences of up
        to max_context tokens in all; or None: this model decodes eagerly."""


def check_span(tokens: torch.Tensor, cache: Cache, start: int) -> int:
    """A prefill's positions start..start+T-1 must fit the cache -> T. tokens: [T]."""
    t = int(tokens.shape[0])
    if t == 0 or start < 0 or start + t > cache.max_tokens:
        raise ValueError(f"positions {start}..{start + t - 1} do not fit a cache of "
                         f"{cache.max_tokens} tokens")
    return t
