"""Kimi-Linear's decode step in static device tensors, for a CUDA graph (engine/runner.py).

Per step, `load` copies the batch's token ids, state slots, block tables and positions into
the bucket's tensors; rows past the batch point at the model's scratch sequence (its own slot
and block, position 0), so a padded row reads and writes only scratch. `run` is
model.decode_rows on those tensors: the work a graph captures, and on the CPU the same step
run eagerly. The pools are reserved before the first capture and must not move afterwards:
`load` refuses a step whose pools were reallocated (the runner then decodes eagerly).
"""
import torch

from engined.models.kimi_cache import DecodeRows


class PoolsMoved(RuntimeError):
    """A pool was reallocated after this step was built: its graph reads stale addresses."""


class KimiGraphStep:
    def __init__(self, model, rows: int, max_blocks: int):
        device = model.device
        self.model, self.rows, self.max_blocks = model, rows, max_blocks
        self.scratch = model.scratch_cache()
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)               # [B]
        self.inputs = DecodeRows(torch.zeros(rows, dtype=torch.int64, device=device),     # slots
                                 torch.zeros(rows, max_blocks, dtype=torch.int64, device=device),
                                 torch.zeros(rows, dtype=torch.int64, device=device))     # positions
        self.addresses = model.pool_addresses()
        self.logits: torch.Tensor | None = None
        self.load_scratch()

    def load_scratch(self):
        """Every row on the scratch sequence (warm-up and capture)."""
        self._copy_in([0] * self.rows, [self.scratch] * self.rows, [0] * self.rows)

    def load(self, tokens: list[int], caches: list, positions: list[int]):
        """The batch's rows, then scratch rows up to the bucket."""
        if self.model.pool_addresses() != self.addresses:
            raise PoolsMoved("the state or latent pool was reallocated after capture")
        for cache, pos in zip(caches, positions):
            if pos != cache.num_tokens or not 0 <= pos < cache.max_tokens:
                raise ValueError(f"position {pos} does not continue a cache holding "
                                 f"{cache.num_tokens} of {cache.max_tokens} tokens")
        pad = self.rows - len(tokens)
        self._copy_in(tokens + [0] * pad, caches + [self.scratch] * pad, positions + [0] * pad)

    def _copy_in(self, tokens: list[int], caches: list, positions: list[int]):
        tables = [c.blocks + c.blocks[:1] * (self.max_blocks - len(c.blocks)) for c in caches]
        self.tokens.copy_(torch.tensor(tokens, dtype=torch.int64), non_blocking=True)
        for target, values in zip(self.inputs, ([c.slot for c in caches], tables, positions)):
            target.copy_(torch.tensor(values, dtype=torch.int64), non_blocking=True)

    def run(self) -> torch.Tensor:
        """logits fp32 [rows, V]: a graph replay refills this same tensor."""
        self.logits = self.model.decode_rows(self.tokens, self.inputs)
        return self.logits

    def finish(self, caches: list, positions: list[int]):
        for cache, pos in zip(caches, positions):
            cache.num_tokens = pos + 1
