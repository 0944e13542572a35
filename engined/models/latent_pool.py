"""Kimi-Linear's MLA latent rows in fixed-size blocks, one pool for every sequence (nano-vllm's
block manager, vLLM's paged KV cache).

Per MLA layer one tensor [num_blocks, BLOCK, R+P]; a block id names the same rows in every
layer. A sequence owns the blocks of its block table: position s lives at
(table[s // BLOCK], s % BLOCK). BLOCK = 64 is FlashMLA's page size (its kernels could read this
pool as it is), 64 positions make a 32k-token table only 512 entries, and the rounding costs a
sequence at most 63 rows (Kimi-Linear: 63 x 8,064 B, about 0.5 MB beside its 42 MB KDA state).
The pool grows when a sequence needs more blocks than are free, to the peak in use; freed
blocks stay allocated for the next sequence.
"""
import torch

BLOCK = 64


def num_blocks_for(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK)


def rows_of(table: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Flat row indices (into a layer's [num_blocks * BLOCK, R+P] view) of positions
    [start, end) of the sequence whose block table is `table` [nb] -> [end - start] int64."""
    pos = torch.arange(start, end, device=table.device)
    return table[pos // BLOCK] * BLOCK + pos % BLOCK


class LatentPool:
    """Blocks of latent rows for every MLA layer. `widths`: layer index -> R+P."""

    def __init__(self, widths: dict[int, int], dtype, device):
        self.widths, self.dtype, self.device = widths, dtype, device
        self.latents: dict[int, torch.Tensor] = {}
        self.num_blocks = 0
        self.free_blocks: list[int] = []
        self._grow(0)

    @torch.inference_mode(False)
    def _grow(self, num_blocks: int):
        """Room for num_blocks blocks: the live ones are copied to the new tensors (addresses
        change, so a captured CUDA graph needs `reserve` before it is captured). Never inference
        tensors, which refuse in-place updates outside inference mode."""
        for i, width in self.widths.items():
            latents = torch.zeros((num_blocks, BLOCK, width), dtype=self.dtype, device=self.device)
            if self.num_blocks:
                latents[:self.num_blocks].copy_(self.latents[i])
            self.latents[i] = latents
        self.free_blocks += range(self.num_blocks, num_blocks)
        self.num_blocks = num_blocks

    def reserve(self, num_blocks: int):
        if num_blocks > self.num_blocks:
            self._grow(num_blocks)

    def allocate(self, num_blocks: int) -> list[int]:
        """num_blocks zeroed blocks (the lowest free ids); the pool grows by what is missing."""
        if num_blocks > len(self.free_blocks):
            self._grow(self.num_blocks + num_blocks - len(self.free_blocks))
        blocks, self.free_blocks = self.free_blocks[:num_blocks], self.free_blocks[num_blocks:]
        self.zero(blocks)
        return blocks

    def release(self, blocks: list[int]):
        free = set(self.free_blocks)
        if len(set(blocks)) != len(blocks) or any(b in free or not 0 <= b < self.num_blocks for b in blocks):
            raise ValueError(f"blocks {blocks} are not all in use")
        self.free_blocks = sorted(free.union(blocks))

    def zero(self, blocks: list[int]):
        if blocks:
            ids = torch.tensor(blocks, dtype=torch.int64, device=self.device)
            for latents in self.latents.values():
                latents.index_fill_(0, ids, 0)

    def flat(self, layer: int) -> torch.Tensor:
        """Layer's rows as a view [num_blocks * BLOCK, R+P]: writes go to the pool."""
        return self.latents[layer].view(-1, self.widths[layer])

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all MLA layers."""
        return BLOCK * sum(self.widths.values()) * self.dtype.itemsize

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)
