"""Routed experts in system RAM (llama.cpp's --cpu-moe): the hybrid MoE step.

For a MoE layer whose expert banks live in RAM, the device computes the router and the
shared expert; the hidden rows and the top-k ids and weights go to host buffers; the CPU
threads run the routed experts with the multi-row grouped op (moe_grouped, cpu_c: each
chosen expert read once for all the rows that chose it, so a prefill chunk reads an expert
once); the result goes back and is added in. Only [T, D] activations and [T, k] routing
cross the bus. The buffers are pinned when the model is on CUDA, so the copies are DMA and
the shared expert's kernels run on the GPU while the CPU computes. On a CPU-only machine the
"device" half runs on the CPU through the same code and the same buffers.

A CUDA graph cannot contain the CPU part, so the decode step of a model with offloaded
layers is captured piecewise (models/kimi_piecewise.py): the step's parts are `send` (in the
graph before the CPU), `compute` (between the replays) and `receive` (in the graph after).
With a VRAM cache of hot experts (layers/expert_cache.py, --moe-cache), `decide` splits a
call's routes between the cache and the CPU, `run_cached` runs the cached ones on the device
(queued before the CPU part, so both work at once) and `receive` adds them in.
Letters: t token, k choice, d hidden.
"""
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from engined.layers.expert_cache import ExpertCache, Split
from engined.ops import registry


@dataclass
class OffloadCounters:
    """What crossed the host buffers, for kimi_engine_offload_* (proof the hybrid path ran)."""
    moe_calls: int = 0        # MoE layer calls whose routed experts ran on the CPU
    bytes_to_host: int = 0    # hidden rows, top-k ids and weights copied into host buffers
    bytes_to_device: int = 0  # routed outputs copied back
    cache: Any = None         # layers/expert_cache.CacheCounters with an expert cache


class HostRows(NamedTuple):
    """Views of `rows` rows of a HostBuffers: x, out [T, D] fp32; ids [T, k] int64; weights
    [T, k] fp32; slots, device_weights [T, k]: the routes the expert cache runs."""
    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    out: torch.Tensor
    slots: torch.Tensor
    device_weights: torch.Tensor


class HostBuffers:
    """One set of host rows shared by every offloaded layer of a model (layers run one after
    another), grown to the largest T seen. x, out: [T, D] fp32; ids: [T, k] int64;
    weights: [T, k] fp32."""

    def __init__(self, hidden: int, top_k: int, device: torch.device, for_graphs: bool = False):
        """for_graphs: rows that CUDA graphs copy to and from: page-locked by registering
        plain memory with CUDA (cudaHostRegister), not from torch's pinned-memory cache, whose
        copies record events that a capture must not make and later allocations query."""
        self.hidden, self.top_k, self.device = hidden, top_k, torch.device(device)
        self.is_pinned, self.for_graphs = self.device.type == "cuda", for_graphs
        self.num_rows = 0
        self._copied_back = None  # the event after the last copy out of `out` (CUDA)
        self._grow(1)

    def _grow(self, rows: int):
        def new(*shape, dtype=torch.float32):
            if self.is_pinned and self.for_graphs:
                return page_locked(torch.empty(shape, dtype=dtype))
            return torch.empty(shape, dtype=dtype, pin_memory=self.is_pinned)
        self.x, self.out = new(rows, self.hidden), new(rows, self.hidden)
        self.ids = new(rows, self.top_k, dtype=torch.int64)
        self.weights, self.device_weights = new(rows, self.top_k), new(rows, self.top_k)
        self.slots = new(rows, self.top_k, dtype=torch.int64)
        self.num_rows = rows

    def take(self, rows: int) -> HostRows:
        """-> views of `rows` rows, free to overwrite: the previous call's copy back to the
        device has finished."""
        if self._copied_back is not None:
            self._copied_back.synchronize()
            self._copied_back = None
        if rows > self.num_rows:
            self._grow(max(rows, 2 * self.num_rows))
        return HostRows(*(t[:rows] for t in (self.x, self.ids, self.weights, self.out,
                                              self.slots, self.device_weights)))

    def to_device(self, out: torch.Tensor) -> torch.Tensor:
        """out [T, D] fp32 (host) -> on the device, asynchronously on CUDA; the next `take`
        waits for the copies queued so far."""
        moved = out.to(self.device, non_blocking=self.is_pinned)
        if self.is_pinned:
            self._copied_back = torch.cuda.Event()
            self._copied_back.record()
        return moved


class HostExperts:
    """The routed experts of one MoE layer, held in RAM and computed by the CPU threads."""

    def __init__(self, buffers: HostBuffers, counters: OffloadCounters, layer: int = 0):
        self.buffers, self.counters, self.layer = buffers, counters, layer
        self.cache: ExpertCache | None = None    # set by the model when it has one
        self.follower = None    # layers/route_trace.RouteFollower: a recorded trace's experts
        self.select("moe_grouped")
        self._split: Split | None = None
        self._found: dict[int, int] = {}

    def select(self, op: str):
        """The op the CPU threads run the routed experts with: moe_grouped (W4A16), or
        moe_grouped_w4a8 (MoE.select_experts)."""
        self._grouped = registry.resolve(op, "cpu").fn

    def __call__(self, f: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                 banks, shared) -> torch.Tensor:
        """The eager hybrid step. f: [T, D] on the device; experts, weights: [T, k] from the
        router on the device; banks: (w1, w3, w2) ExpertBanks in RAM; shared: the shared
        expert or None -> routed + shared [T, D] in f.dtype on the device."""
        rows = self.buffers.take(f.shape[0])
        self.send(f, experts, weights, rows)
        ready = event_after_copies(self.buffers.is_pinned)
        shared_out = shared(f) if shared is not None else None  # queued on the GPU meanwhile
        if ready is not None:
            ready.synchronize()
        cached_out = None
        if self.cache is not None:
            self.decide(rows)
            cached_out = self.run_cached(f, rows)               # queued before the CPU part
        self.compute(rows, banks)
        return _sum(self.buffers.to_device(rows.out), cached_out, shared_out, f.dtype)

    def send(self, f: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, rows: HostRows):
        """The hidden rows and their routing into host rows (asynchronous from the GPU: the
        CPU waits for an event after them before `compute`)."""
        pinned = self.buffers.is_pinned
        rows.x.copy_(f, non_blocking=pinned)
        rows.ids.copy_(experts, non_blocking=pinned)
        rows.weights.copy_(weights, non_blocking=pinned)

    def decide(self, rows: HostRows, live: int | None = None):
        """With the cache, once the routing is in host rows: which chosen experts it holds,
        and each side's routes (rows.slots and rows.device_weights for run_cached). live: the
        first rows that are a batch's (a graph step's padding after them is looked up for no
        expert, and the cache runs nothing for it: weight 0)."""
        self._follow(rows, live)
        ids, weights = (rows.ids, rows.weights) if live is None else (rows.ids[:live], rows.weights[:live])
        chosen = torch.unique(ids).tolist()
        self._found = self.cache.lookup(self.layer, chosen)
        self._split = Split(ids, weights, self._found, self.cache.num_experts)
        n = ids.shape[0]
        rows.slots[:n].copy_(self._split.slots)
        rows.device_weights[:n].copy_(self._split.device_weights)
        rows.slots[n:] = 0  # a slot there always is, at weight 0
        rows.device_weights[n:] = 0.0

    def run_cached(self, f: torch.Tensor, rows: HostRows) -> torch.Tensor:
        """The cached experts' routes on the device (weight 0 elsewhere) -> [T, D] fp32."""
        move = dict(device=self.buffers.device, non_blocking=self.buffers.is_pinned)
        return registry.resolve("moe_grouped", f.device.type).fn(
            f, *self.cache.pool, rows.slots.to(**move), rows.device_weights.to(**move))

    def compute(self, rows: HostRows, banks, live: int | None = None):
        """The routed experts on the CPU threads: rows.out = Σ_k weight_k Expert_k(x), over
        the routes the cache does not run; then the cache's misses are uploaded. live: the
        first rows that are a batch's; the padding of a graph step's bucket after them costs
        the CPU nothing (its out rows are zeros)."""
        packed = tuple(bank.packed for bank in banks)
        split, self._split = self._split, None
        if split is None:                                       # else `decide` followed it
            self._follow(rows, live)
        n = rows.x.shape[0] if live is None else live
        x, ids, out = rows.x[:n], rows.ids[:n], rows.out[:n]
        rows.out[n:].zero_()
        if split is None:
            self._grouped(x, *packed, ids, rows.weights[:n], out=out)
        elif split.has_cpu:
            self._grouped(x, *packed, split.cpu_ids, split.cpu_weights, out=out)
        else:
            out.zero_()
        if split is not None:
            missed = [e for e in torch.unique(ids).tolist() if e not in self._found]
            self.cache.admit(self.layer, missed, packed, set(self._found.values()))
        self._count(rows)

    def _follow(self, rows: HostRows, live: int | None):
        """With a route trace: the live rows' experts become its next ones, each with the
        router's weight of its rank. On the host, once the routing is in host rows: a
        captured step's graphs stay as they are (layers/route_trace.py)."""
        if self.follower is not None:
            n = rows.ids.shape[0] if live is None else live
            rows.ids[:n].copy_(self.follower.next(n))

    def receive(self, rows: HostRows, shared_out: torch.Tensor | None, dtype,
                cached_out: torch.Tensor | None = None) -> torch.Tensor:
        """rows.out back on the device, plus the cached experts' and the shared expert's
        outputs, in dtype: what a CUDA graph replays after the CPU part (a copy from pinned
        memory, no event)."""
        routed = rows.out.to(self.buffers.device, non_blocking=self.buffers.is_pinned)
        return _sum(routed, cached_out, shared_out, dtype)

    def _count(self, rows: HostRows):
        self.counters.moe_calls += 1
        self.counters.bytes_to_host += sum(t.nbytes for t in (rows.x, rows.ids, rows.weights))
        self.counters.bytes_to_device += rows.out.nbytes


def _sum(routed: torch.Tensor, cached_out, shared_out, dtype) -> torch.Tensor:
    """routed (+ cached, in fp32) in dtype (+ shared)."""
    routed = (routed if cached_out is None else routed + cached_out).to(dtype)
    return routed if shared_out is None else routed + shared_out


def page_locked(t: torch.Tensor) -> torch.Tensor:
    """t's memory page-locked while it lives: until its storage is freed, not until t's
    Python object goes. Under inference_mode a view keeps no link to its base tensor, so the
    rows a graph step takes (HostBuffers.take, views) outlived the base tensors, and a
    finalizer on those unregistered every row before the capture: copies from pageable
    memory, which a CUDA graph refuses."""
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(t.data_ptr(), t.nbytes, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {t.nbytes} B failed: CUDA error {int(err)}")
    weakref.finalize(t.untyped_storage(), cudart.cudaHostUnregister, t.data_ptr())
    return t


def event_after_copies(is_cuda: bool):
    """An event recorded on the current stream after the copies queued so far (None on the
    CPU, where they are done)."""
    if not is_cuda:
        return None
    event = torch.cuda.Event()
    event.record()
    return event
