"""Kimi-Linear's per-sequence cache: every KDA state in a slot of one pool per layer, and the
MLA latent rows in blocks of the model's latent pool (models/latent_pool.py).

The pool holds, per KDA layer, the conv windows [N, 3, C, W-1] and the recurrent states
[N, H, K, V] fp32 of N sequences; a sequence owns one slot index. Batched decode reads and
updates the B rows' states by slot (ops/kda_step), and a single sequence's prefill works on
views of its slot, so no state is ever copied per step. A slot is returned to the pool when
its cache is released (or garbage-collected). The pool grows one slot at a time, so it holds
the peak number of concurrent sequences (each reserved against the memory cap as state_bytes
while it lives); freed slots stay allocated for the next sequence.
"""
import weakref
from typing import NamedTuple

import torch

from engined.layers.kda import KDAState
from engined.models.latent_pool import LatentPool, num_blocks_for, rows_of


class DecodeRows(NamedTuple):
    """One decode step's rows as device tensors: all a captured CUDA graph needs per step."""
    slots: torch.Tensor          # [B] int64 KDA state slots
    block_tables: torch.Tensor   # [B, MB] int64 latent blocks (a row's first block pads it)
    positions: torch.Tensor      # [B] int64
    lengths: torch.Tensor | None = None   # [B] int64, positions + 1: made once a step
    passes: tuple["StatePass", ...] | None = None  # KDA in passes: rows of one sequence at
    #                                               consecutive positions (None: one pass)


class StatePass(NamedTuple):
    """The rows of a step that are each their sequence's j-th (a sequence's rows run in
    order): their KDA step runs from the states in `source` (None for j = 0: their own
    slots, in place), written to `slots`."""
    rows: torch.Tensor            # [n] int64 row indices in the step
    slots: torch.Tensor           # [n] int64 the rows' state slots
    source: torch.Tensor | None   # [n] int64 the slots of the rows before them


class StatePool:
    """Slots of KDA state for every KDA layer. `layers`: layer index -> its KDA module."""

    def __init__(self, layers: dict, dtype, device):
        metas = {i: kda.new_state(dtype, "meta") for i, kda in layers.items()}
        self.shapes = {i: (m.conv.shape, m.S.shape) for i, m in metas.items()}
        self.dtype, self.device = dtype, device
        self.conv: dict[int, torch.Tensor] = {}
        self.S: dict[int, torch.Tensor] = {}
        self.num_slots = 0
        self.free_slots: list[int] = []
        self._grow(0)

    @torch.inference_mode(False)
    def _grow(self, num_slots: int):
        """Room for num_slots sequences: live slots are copied to the new tensors (addresses
        change, so a captured CUDA graph needs `reserve` before it is captured). Never
        inference tensors, whatever mode the caller is in: those refuse in-place updates
        outside inference mode."""
        for i, (conv_shape, s_shape) in self.shapes.items():
            conv = torch.zeros((num_slots, *conv_shape), dtype=self.dtype, device=self.device)
            S = torch.zeros((num_slots, *s_shape), dtype=torch.float32, device=self.device)
            if self.num_slots:
                conv[:self.num_slots].copy_(self.conv[i])
                S[:self.num_slots].copy_(self.S[i])
            self.conv[i], self.S[i] = conv, S
        self.free_slots += range(self.num_slots, num_slots)
        self.num_slots = num_slots

    def reserve(self, num_slots: int):
        if num_slots > self.num_slots:
            self._grow(num_slots)

    def allocate(self) -> int:
        """A zeroed slot; the pool grows by one when none is free."""
        if not self.free_slots:
            self._grow(self.num_slots + 1)
        slot = self.free_slots.pop(0)
        self.zero(slot)
        return slot

    def release(self, slot: int):
        if slot in self.free_slots or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not in use")
        self.free_slots.append(slot)
        self.free_slots.sort()

    def zero(self, slot: int):
        for i in self.shapes:
            self.conv[i][slot].zero_()
            self.S[i][slot].zero_()

    def state(self, layer: int, slot: int) -> KDAState:
        """Views of one slot's conv windows and state: writes go to the pool."""
        return KDAState(self.conv[layer][slot], self.S[layer][slot])

    @property
    def slot_bytes(self) -> int:
        """Bytes of one sequence's KDA state across all layers (conv windows + S)."""
        return sum(conv.numel() * self.dtype.itemsize + S.numel() * 4
                   for conv, S in self.shapes.values())

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self.free_slots)


class KimiCache:
    """One sequence: a slot of the model's state pool and the blocks of its latent pool that
    hold positions 0..max_tokens-1 (all allocated here, so its memory is bounded by its own
    max_tokens). `num_tokens` counts positions already folded into the recurrent state.

    A decode step may run r + 1 rows of the sequence at positions p..p+r (its input token and
    the drafts a speculative step verifies). Row j's state goes to slots[j]: slots[0] is the
    sequence's own, the others are draft slots, taken from the pool at a sequence's first
    such step and kept until it ends. Whichever position the next step continues from
    (`resume`), the slot holding the state before it becomes slots[0] by a swap, so rejected
    drafts cost no copy and leave nothing behind; their latent rows are overwritten before
    any row reads them."""

    is_recurrent = True  # resuming needs a state snapshot, not just rows (prefix_cache.py)

    def __init__(self, pool: StatePool, latent_pool: LatentPool, max_tokens: int):
        self.pool, self.latent_pool, self.max_tokens, self.num_tokens = pool, latent_pool, max_tokens, 0
        self.slots = [pool.allocate()]  # [own, draft slots...]: released together
        self.verified: tuple[int, int] | None = None  # (first position, rows) of the last step
        #                                               that ran several rows, until resumed
        self.blocks = latent_pool.allocate(num_blocks_for(max_tokens))
        self.block_table = torch.tensor(self.blocks, dtype=torch.int64, device=latent_pool.device)  # [nb]
        self._finalizer = weakref.finalize(self, _release, pool, self.slots, latent_pool, self.blocks)

    @property
    def slot(self) -> int:
        """The slot of this sequence's state (at num_tokens, once resumed)."""
        return self.slots[0]

    def draft_slot(self, row: int) -> int:
        """The slot of this sequence's row `row` of a step (0: its own), taken when first asked."""
        while len(self.slots) <= row:
            self.slots.append(self.pool.allocate())
        return self.slots[row]

    def ran(self, start: int, rows: int):
        """A step ran `rows` rows at positions start..start+rows-1."""
        self.num_tokens = start + rows
        self.verified = (start, rows) if rows > 1 else None

    def resume(self, position: int):
        """Continue at `position`: after a step of several rows, any position that step
        reached (the rows past it are dropped); else only num_tokens."""
        if self.verified is None:
            if position != self.num_tokens:
                raise ValueError(f"Kimi-Linear's recurrent state holds {self.num_tokens} tokens; "
                                 f"it can only continue at position {self.num_tokens}, not {position}")
            return
        start, rows = self.verified
        row = position - 1 - start                    # the row whose state continues
        if not 0 <= row < rows:
            raise ValueError(f"position {position} is not one the last step reached "
                             f"({start + 1}..{start + rows})")
        self.slots[0], self.slots[row] = self.slots[row], self.slots[0]
        self.num_tokens, self.verified = position, None

    def state(self, layer: int) -> KDAState:
        """Views of this sequence's conv windows and recurrent state in one KDA layer."""
        return self.pool.state(layer, self.slot)

    @property
    def kda(self) -> dict[int, KDAState]:
        """KDA layer -> views of this sequence's conv windows and recurrent state."""
        return {i: self.state(i) for i in self.pool.shapes}

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Flat latent-pool rows of positions [start, end) -> [end - start] int64."""
        return rows_of(self.block_table, start, end)

    def release(self):
        """Give the slot and the blocks back now (also done when the cache is garbage-collected)."""
        self._finalizer()

    def read_rows(self, start: int, end: int) -> dict[int, torch.Tensor]:
        """A copy of the MLA latents of positions [start, end): layer -> [end-start, R+P]."""
        rows = self.rows(start, end)
        return {i: self.latent_pool.flat(i).index_select(0, rows) for i in self.latent_pool.widths}

    def write_rows(self, start: int, rows: dict[int, torch.Tensor]):
        for i in self.latent_pool.widths:
            self.latent_pool.flat(i).index_copy_(0, self.rows(start, start + rows[i].shape[0]), rows[i])

    def save_state(self) -> dict[int, KDAState]:
        """A copy of every KDA layer's conv windows and recurrent state at num_tokens (not
        between a step of several rows and the resume that picks its row: ValueError)."""
        if self.verified is not None:
            raise ValueError("the state after a step of several rows is known once the next "
                             "step resumes from one of them")
        return {i: KDAState(s.conv.clone(), s.S.clone()) for i, s in self.kda.items()}

    def load_state(self, state: dict[int, KDAState], num_tokens: int):
        """Copy a snapshot in (the snapshot stays untouched, so it can be restored again)."""
        for i, s in self.kda.items():
            s.conv.copy_(state[i].conv)
            s.S.copy_(state[i].S)
        self.num_tokens, self.verified = num_tokens, None

    def reset(self):
        """Back to an empty sequence, in place (tensor addresses stay valid for a captured graph)."""
        self.pool.zero(self.slot)
        self.latent_pool.zero(self.blocks)
        self.num_tokens, self.verified = 0, None


def _release(pool: StatePool, slots: list[int], latent_pool: LatentPool, blocks: list[int]):
    for slot in slots:
        pool.release(slot)
    latent_pool.release(blocks)
