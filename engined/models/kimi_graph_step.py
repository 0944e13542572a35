"""Kimi-Linear's decode step in static device tensors, for a CUDA graph (engine/runner.py).

Per step, `load` copies the batch's token ids, state slots, block tables and positions into
the bucket's tensors; rows past the batch point at the model's scratch sequence (its own slot
and block, position 0), so a padded row reads and writes only scratch. `run` is
model.decode_rows on those tensors: the work a graph captures, and on the CPU the same step
run eagerly. The pools are reserved before the first capture and must not move afterwards:
`load` refuses a step whose pools were reallocated (the runner then decodes eagerly).

A step is a list of GPU `segments`, each but the last followed by a `Crossing` to the CPU:
this step has one segment (model.decode_rows) and no crossing; a model with experts in RAM
has one segment per offloaded MoE layer plus one (models/kimi_piecewise.py). The runner
captures each segment (and each crossing's `overlap`) in a graph of its own and replays them
in order through `run(replays)`; on the CPU `run()` calls them directly.
"""
from typing import Callable, NamedTuple

import torch

from engined.layers.moe_offload import event_after_copies
from engined.models.kimi_cache import DecodeRows
from engined.models.kimi_rows import flat_ints, views
from engined.models.protocol import StaleGraphs


class Crossing(NamedTuple):
    """The CPU part between two segments: after the segment's copies to host memory have
    landed, `compute` runs on the CPU threads; `overlap` (GPU work that needs nothing from
    the CPU, such as the shared expert; None: none) is queued first, so it runs meanwhile.
    With an expert cache, `decide` (host) first splits the routes and `cached` (GPU) runs
    the cached experts' share, queued before `compute`."""
    overlap: Callable[[], None] | None
    compute: Callable[[], None]
    decide: Callable[[], None] | None = None
    cached: Callable[[], None] | None = None


class PoolsMoved(StaleGraphs):
    """A pool was reallocated after this step was built: its graph reads stale addresses."""


class KimiGraphStep:
    def __init__(self, model, rows: int, max_blocks: int):
        device = model.device
        self.model, self.rows, self.max_blocks = model, rows, max_blocks
        self.scratch = model.scratch_cache()
        # tokens [B], slots [B], block tables [B, MB], positions [B]: views of one tensor,
        # so a step's values arrive in one copy (from page-locked memory on CUDA)
        packed = torch.zeros(rows * (3 + max_blocks), dtype=torch.int64, device=device)
        self.tokens, *inputs = views(packed, [(rows,), (rows,), (rows, max_blocks), (rows,)])
        self.inputs, self.packed = DecodeRows(*inputs), packed
        self.staging = self.copied = None
        if packed.is_cuda:
            self.staging = torch.empty_like(packed, device="cpu").pin_memory()
            self.copied = torch.cuda.Event()
        self.addresses = model.pool_addresses()
        self.logits: torch.Tensor | None = None
        self.live = rows  # the rows `load` filled with the batch's; scratch padding after them
        self.segments: list[Callable[[], None]] = [self._whole]
        self.crossings: list[Crossing] = []
        self.load_scratch()

    def pieces(self) -> list[Callable[[], None]]:
        """The GPU pieces in the order a step runs them (and the runner captures them):
        each segment, then its crossing's overlap."""
        after = [(c.overlap, c.cached) for c in self.crossings] + [(None, None)]
        return [p for segment, gpu in zip(self.segments, after) for p in (segment, *gpu) if p]

    def load_scratch(self):
        """Every row on the scratch sequence (warm-up and capture)."""
        self.live = self.rows
        self._copy_in([0] * self.rows, [self.scratch] * self.rows, [0] * self.rows)

    def load(self, tokens: list[int], caches: list, positions: list[int]):
        """The batch's rows, then scratch rows up to the bucket."""
        if self.model.pool_addresses() != self.addresses:
            raise PoolsMoved("the state or latent pool was reallocated after capture")
        for cache, pos in zip(caches, positions):
            if not 0 <= pos < cache.max_tokens:
                raise ValueError(f"position {pos} does not fit a cache of {cache.max_tokens} tokens")
            cache.resume(pos)    # after an eager step that verified drafts: that row's slot
        pad = self.rows - len(tokens)
        self.live = len(tokens)
        self._copy_in(tokens + [0] * pad, caches + [self.scratch] * pad, positions + [0] * pad)

    def _copy_in(self, tokens: list[int], caches: list, positions: list[int]):
        tables = [c.blocks + c.blocks[:1] * (self.max_blocks - len(c.blocks)) for c in caches]
        values, _ = flat_ints([tokens, [c.slot for c in caches], tables, positions])
        host = torch.tensor(values, dtype=torch.int64)
        if self.staging is not None:
            self.copied.synchronize()        # the last step's copy has left the staging buffer
            host = self.staging.copy_(host)
        self.packed.copy_(host, non_blocking=True)
        if self.staging is not None:
            self.copied.record()

    def run(self, replays: dict | None = None) -> torch.Tensor:
        """One decode step -> logits fp32 [rows, V] (a graph replay refills this same tensor).
        replays: piece -> its graph's replay (engine/runner.py); None: every piece runs."""
        play = (lambda piece: replays[piece]()) if replays else (lambda piece: piece())
        for segment, crossing in zip(self.segments, self.crossings + [None]):
            play(segment)
            if crossing is None:
                break
            copied = event_after_copies(self.tokens.is_cuda)    # the segment's copies out
            if crossing.overlap is not None:
                play(crossing.overlap)
            if copied is not None:
                copied.synchronize()
            if crossing.decide is not None:
                crossing.decide()
                play(crossing.cached)
            crossing.compute()
        return self.logits

    def _whole(self):
        self.logits = self.model.decode_rows(self.tokens, self.inputs)

    def finish(self, caches: list, positions: list[int]):
        for cache, pos in zip(caches, positions):
            cache.ran(pos, 1)
