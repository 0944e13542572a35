"""A VRAM cache of hot routed experts for the MoE layers whose experts live in RAM
(--moe-cache SIZE; llama.cpp's forks call it --moe-cache-mib).

One fixed pool of expert slots on the device, shared by every offloaded layer, each slot an
expert's w1, w3 and w2 (INT4 codes, scales, mins). Per MoE call the host looks up the
experts the router chose (`lookup`, least recently used evicted first): a found expert runs
on the device from its slot (moe_grouped on the pool, `split`'s device routes), the rest on
the CPU threads (its CPU routes); each side's routes of the other side keep a weight of 0
and point at an expert that side reads anyway, so neither reads an expert it does not run.
Misses are uploaded afterwards (`admit`, at most `max_uploads` a call) on a side stream,
after the work already queued on the device, and a slot serves only once its upload has
finished (an event queried, never waited for), so uploads stay off the decode step's path.
On a CPU-only machine the "device" pool is CPU memory and an upload a plain copy: the same
bookkeeping, testable. The banks in RAM may lie in the CPU's tiles (the C helper's fastest
layout): a GPU pool's upload puts an expert back in rows on the device, then in its
kernels' order; a CPU pool keeps the tiles. Letters: s slot, t token, k choice, e expert.
"""
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from engined.ops import int4_format
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts


@dataclass
class CacheCounters:
    """What the cache did, for kimi_engine_moe_cache_* (per offloaded layer)."""
    hits: dict[int, int] = field(default_factory=dict)     # layer -> chosen experts found
    misses: dict[int, int] = field(default_factory=dict)   # layer -> chosen experts not found
    uploads: int = 0
    upload_bytes: int = 0


class Split:
    """One call's routes for each side. ids/weights: [T, k] for the CPU banks; slots and
    device weights: [T, k] for the pool. has_cpu/has_device: whether that side has a route."""

    def __init__(self, ids, weights, found: dict[int, int], num_experts: int):
        table = torch.full((num_experts,), -1, dtype=torch.int64)
        if found:
            table[torch.tensor(list(found))] = torch.tensor(list(found.values()))
        slots = table[ids]                                         # [T, k], -1: on the CPU
        on_device = slots >= 0
        self.has_device, self.has_cpu = bool(on_device.any()), not bool(on_device.all())
        any_cpu = ids[~on_device][0] if self.has_cpu else 0
        any_slot = slots[on_device][0] if self.has_device else 0
        self.cpu_ids = ids.masked_fill(on_device, int(any_cpu))
        self.cpu_weights = weights.masked_fill(on_device, 0.0)
        self.slots = slots.masked_fill(~on_device, int(any_slot))
        self.device_weights = weights.masked_fill(~on_device, 0.0)


class ExpertCache:
    def __init__(self, num_slots: int, like: tuple[PackedInt4Experts, ...], device,
                 max_uploads: int = 2):
        """like: (w1, w3, w2) of one offloaded layer, for the slots' shapes and layout."""
        if num_slots < 1:
            raise ValueError(f"an expert cache needs at least one slot, got {num_slots}")
        self.device, self.num_slots, self.max_uploads = torch.device(device), num_slots, max_uploads
        self.num_experts = like[0].num_experts
        self.is_cuda = self.device.type == "cuda"
        self.pool = tuple(_empty_like(bank, num_slots, self.device, self.is_cuda) for bank in like)
        self.slot_bytes = sum(_nbytes(bank) // bank.num_experts for bank in like)
        self.counters = CacheCounters()
        self._slots: OrderedDict[tuple[int, int], int] = OrderedDict()  # least recent first
        self._free = list(range(num_slots - 1, -1, -1))
        self._uploaded: dict[int, torch.cuda.Event] = {}   # slot -> its upload's event (CUDA)
        self._stream = torch.cuda.Stream(self.device) if self.is_cuda else None

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.slot_bytes

    def lookup(self, layer: int, experts: list[int]) -> dict[int, int]:
        """The distinct experts one call of `layer` chose -> {expert: slot} of those whose
        upload has finished, each now the most recently used; counted as hits and misses."""
        found = {}
        for e in experts:
            slot = self._slots.get((layer, e))
            if slot is not None and self._is_ready(slot):
                self._slots.move_to_end((layer, e))
                found[e] = slot
        self.counters.hits[layer] = self.counters.hits.get(layer, 0) + len(found)
        self.counters.misses[layer] = self.counters.misses.get(layer, 0) + len(experts) - len(found)
        return found

    def admit(self, layer: int, experts: list[int], banks: tuple[PackedInt4Experts, ...],
              in_use: set[int]):
        """Upload up to max_uploads of `experts` (misses of this call) from the layer's banks
        in RAM into free or least recently used slots, never one of `in_use`."""
        uploads = 0
        for e in experts:
            if uploads == self.max_uploads:
                break
            if (layer, e) in self._slots:
                continue                                  # still uploading
            slot = self._take_slot(in_use)
            if slot is None:
                break
            self._upload(slot, banks, e)
            self._slots[(layer, e)] = slot
            uploads += 1

    def follow_(self, tiles: bool):
        """The banks in RAM went into the CPU's tiles (or back; MoE.select_experts, at load,
        for each offloaded layer: their shapes are one pool's, so they tile alike): a pool in
        CPU memory holds its experts as they lie in RAM (hits run moe_grouped on it, and with
        W4A16 misses run the same kernels); a GPU pool keeps its kernels' order
        (to_gpu_order_). Empties it."""
        if not self.is_cuda:
            self.pool = tuple(PackedInt4Experts(p.qweight, p.scales, p.mins, p.group_size,
                                                tiles=tiles) for p in self.pool)
        self._slots.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))

    def _take_slot(self, in_use: set[int]) -> int | None:
        if self._free:
            return self._free.pop()
        victim = next((key for key, slot in self._slots.items() if slot not in in_use), None)
        return None if victim is None else self._slots.pop(victim)

    def _is_ready(self, slot: int) -> bool:
        event = self._uploaded.get(slot)
        if event is None:
            return True
        if not event.query():
            return False
        del self._uploaded[slot]
        return True

    def _upload(self, slot: int, banks: tuple[PackedInt4Experts, ...], e: int):
        pairs = [(dst, src) for pool, bank in zip(self.pool, banks)
                 for dst, src in zip(_parts(pool, slot), _parts(bank, e))]
        if not self.is_cuda:
            for dst, src in pairs:
                dst.copy_(src)
        else:  # after what the device has queued (a previous user of the slot), off its path
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                for dst, src in pairs:
                    dst.copy_(src, non_blocking=True)
                for pool, bank in zip(self.pool, banks):
                    to_gpu_order_(pool, slot, bank.tiles)
                self._uploaded[slot] = self._stream.record_event()
        self.counters.uploads += 1
        self.counters.upload_bytes += sum(src.nbytes for _, src in pairs)


def to_gpu_order_(pool: PackedInt4Experts, slot: int, tiled: bool):
    """An expert just uploaded into `slot` of a GPU pool, as it lay in RAM (in the CPU's tiles
    when `tiled`, else the disk's order) -> the GPU kernels' order, in place, by device ops
    alone: nothing the host reads, so the upload's stream is never waited for."""
    parts = [None if t is None else t[slot] for t in (pool.qweight, pool.scales, pool.mins)]
    if tiled:  # torch's ops, never the C helper's: these tensors are the device's
        int4_format.tile_blocks_(int4_format.PackedInt4(*parts, pool.group_size, tiles=True),
                                 back=True)
    parts[0].copy_(int4_format.gpu_order(parts[0], pool.group_size))


def _parts(bank: PackedInt4Experts, e: int) -> list[torch.Tensor]:
    return [t[e] for t in (bank.qweight, bank.scales, bank.mins) if t is not None]


def _nbytes(bank: PackedInt4Experts) -> int:
    return sum(t.nbytes for t in (bank.qweight, bank.scales, bank.mins) if t is not None)


def _empty_like(bank: PackedInt4Experts, slots: int, device, gpu_order: bool) -> PackedInt4Experts:
    """A bank of `slots` experts of `bank`'s shape, zero-filled (a slot is read only once
    uploaded; zeros keep an unused pool row finite)."""
    def new(t):
        return None if t is None else torch.zeros((slots, *t.shape[1:]), dtype=t.dtype, device=device)
    return PackedInt4Experts(new(bank.qweight), new(bank.scales), new(bank.mins), bank.group_size,
                             gpu_order)
