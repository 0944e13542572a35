"""The memory budget, planned before any weight is loaded: weights + KV for --max-context.

A plan over the cap refuses the start with the budget spelled out. Under the cap, the
reservation counter is armed with it: the weights are reserved at start and each running
sequence reserves its own KV slots (engine/loop.py), so the plan is also what is enforced.
The cap is what the device can hold. On the CPU, what the kernel will grant: the cgroup limit
(v2 memory.max, v1 memory.limit_in_bytes) lowers --memory-cap, so the engine refuses a plan
cleanly instead of being OOM-killed half-way through loading; `current_rss` is what this
process already holds. On CUDA the device plan is capped by --gpu-memory, lowered to the GPU's
free memory at start, and --memory-cap (with the cgroup limit) caps what stays in RAM: the
routed experts that expert placement (weights/placement.py) keeps there.
The counter is the C helper's (csrc memcap_*); without the compiled helper (the GPU image)
`Reservations` keeps the same count here.
"""
import ctypes
import os
import pathlib
import threading
from dataclasses import dataclass

from engined import helper
from engined.config import format_size


class MemoryCapError(RuntimeError):
    """The planned memory exceeds the cap; the message shows the budget."""


@dataclass(frozen=True)
class Budget:
    weight_bytes: int
    kv_bytes_per_token: int
    max_context: int
    cap_bytes: int  # 0 = no cap
    cap_source: str = "--memory-cap"
    prefill_bytes_per_token: int = 0  # a prefill chunk's attention per token of context (MLA)

    @property
    def kv_bytes(self) -> int:
        return self.kv_bytes_per_token * self.max_context

    @property
    def prefill_bytes(self) -> int:
        """What a prefill chunk holds at once over a context of max_context tokens."""
        return self.prefill_bytes_per_token * self.max_context

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.prefill_bytes

    @property
    def is_over_cap(self) -> bool:
        return bool(self.cap_bytes) and self.total_bytes > self.cap_bytes

    def describe(self) -> str:
        cap = f"{format_size(self.cap_bytes)} ({self.cap_source})" if self.cap_bytes else "none"
        prefill = (f" + prefill attention {format_size(self.prefill_bytes)} (x "
                   f"{format_size(self.prefill_bytes_per_token)})" if self.prefill_bytes else "")
        return (f"weights {format_size(self.weight_bytes)} + KV cache "
                f"{format_size(self.kv_bytes)} ({self.max_context} tokens x "
                f"{format_size(self.kv_bytes_per_token)}){prefill} = "
                f"{format_size(self.total_bytes)}; cap {cap}")


UNLIMITED_V1 = 1 << 60  # v1 reports "no limit" as a page-rounded 2**63 - 1


def _read_limit(path: pathlib.Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit() or int(text) >= UNLIMITED_V1:
        return None
    return int(text)


def cgroup_memory_limit(proc_cgroup: str = "/proc/self/cgroup",
                        cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors, or None."""
    root = pathlib.Path(cgroup_root)
    try:
        lines = pathlib.Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2 unified hierarchy
            base, leaf = root, "memory.max"
        elif "memory" in controllers.split(","):  # v1 memory controller
            base, leaf = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        rel = pathlib.PurePosixPath(path.strip() or "/")
        for parent in [rel, *rel.parents]:  # a namespaced mount shows only some levels
            limits.append(_read_limit(base / str(parent).lstrip("/") / leaf))
    found = [v for v in limits if v is not None]
    return min(found) if found else None


def effective_cap(requested: int, **roots) -> tuple[int, str]:
    """(cap, where it comes from): the requested cap (0 = none of our own), lowered to the
    cgroup's memory limit when that is tighter. roots: cgroup_memory_limit's paths (tests)."""
    limit = cgroup_memory_limit(**roots)
    if limit is not None and (requested <= 0 or limit < requested):
        return limit, "cgroup memory.max"
    return int(requested), "--memory-cap"


def current_rss(statm: str = "/proc/self/statm") -> int:
    """Resident set size of this process in bytes (0 where /proc is unavailable)."""
    try:
        resident_pages = int(pathlib.Path(statm).read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


M_MMAP_THRESHOLD = -3          # mallopt's parameter number (glibc malloc.h)
MMAP_THRESHOLD = 128 << 10     # glibc's initial threshold, kept


def return_large_frees() -> bool:
    """Keep glibc's mmap threshold at its initial 128 KiB, so every freed block above it goes
    back to the kernel at once. Left alone, glibc raises the threshold to the size of each large
    block freed (up to 32 MiB); prefill activations are then carved from the heap and stay
    resident after they are freed (tests/weights/test_kimi_cpu_memory.py, a 200-token prefill
    of a 1 GB Kimi-Linear artifact: VmHWM 28 MiB and the final RSS 40 MiB higher without it).
    Call once at start, before the weights load. False where the C library has no mallopt."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


RETURN_FREES_FROM_BYTES = 1 << 30  # weights in RAM from which return_large_frees is worth it


def settle_allocator(weights_in_ram: int) -> bool:
    """At start, before loading: return_large_frees for a model that holds a GiB or more in
    RAM (CPU-only Kimi-Linear, offloaded experts), where its peak is the point. Not for a
    small one: every large activation then comes from a fresh mmap, whose page faults and
    munmap shootdowns cost the default model 25% of its served 512-token prefill (462 -> 348
    tok/s, bench/ab_engine.py on 2 vCPUs) for a few MiB of peak."""
    return weights_in_ram >= RETURN_FREES_FROM_BYTES and return_large_frees()


def cuda_cap(requested: int, device: str = "cuda") -> tuple[int, str]:
    """(cap, where it comes from) for a model on the GPU: --gpu-memory, lowered to the
    device's free memory now (what this and every other process leave for the weights + KV)."""
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    if requested <= 0 or free < requested:
        return int(free), f"free memory of {torch.cuda.get_device_name(device)}"
    return int(requested), "--gpu-memory"


def plan_budget(plan, max_context: int, requested_cap: int, device: str = "cpu",
                in_ram: int = 0, expert_cache: int = 0) -> Budget:
    """plan: loader.LoadPlan (weight_bytes, kv_bytes_per_token) on `device`. On CUDA,
    requested_cap is --gpu-memory, `in_ram` (routed experts kept in RAM) is not the
    device's and `expert_cache` (its copies of hot ones) is; on the CPU it is --memory-cap
    and every weight counts. A MoE model's parts add what its prefill chunk's attention holds
    over max_context tokens (MLA's keys and values expanded: 5 GiB at 128k for the 48B in bf16,
    twice that in the CPU's fp32), which a long prompt needs beside the weights and the cache."""
    if device.startswith("cuda"):
        cap, source = cuda_cap(requested_cap, device)
        weights = int(plan.weight_bytes) - in_ram + expert_cache
    else:
        (cap, source), weights = effective_cap(requested_cap), int(plan.weight_bytes)
    prefill = plan.parts.prefill_bytes_per_token if plan.parts is not None else 0
    return Budget(weights, int(plan.kv_bytes_per_token), max_context, cap, source, prefill)


def place(plan, config, device: str, max_context: int):
    """-> where a MoE model's routed experts live (weights/placement.Placement), from the plan's
    parts and --cpu-moe / --n-cpu-moe / --gpu-memory (default: the free memory less a margin)
    / --moe-cache;
    None for a model without routed experts. --moe-w4a8 on one without INT4 routed experts is
    refused here, before anything loads."""
    from engined.weights import placement

    if config.moe_w4a8 and not (plan.parts and plan.parts.routed_int4):
        raise placement.PlacementError(
            "--moe-w4a8: W4A8 routed experts need the INT4 artifact; this model has "
            + ("no routed experts" if plan.parts is None else "BF16 ones (kimi-engine quantize)"))
    if plan.parts is None:
        return None
    on_cuda, budget = device.startswith("cuda"), 0
    if on_cuda:
        import torch
        if not config.gpu_memory:
            budget = placement.default_gpu_budget(torch.cuda.mem_get_info(device)[0])
        else:  # the cap cuda_cap enforces; a plan made where no GPU is takes the flag as given
            budget = (cuda_cap(config.gpu_memory, device)[0] if torch.cuda.is_available()
                      else config.gpu_memory)
    placed = placement.plan_placement(plan.parts, "cuda" if on_cuda else "cpu", max_context,
                                      config.max_batch, budget, config.cpu_moe, config.n_cpu_moe,
                                      config.moe_cache, config.prefix_cache_bytes)
    if on_cuda and placed.offloaded and not helper.available():
        # beside a GPU the experts in RAM run on the helper's kernels (the CPU's reference ops
        # are for a CPU-only engine): without it the engine would start, then fail every request
        raise placement.PlacementError(
            f"{placed.reason}: the routed experts of {len(placed.offloaded)} MoE layers would "
            "run in RAM on the C helper, which is not built here (`make setup` builds it; on a "
            "machine without a compiler, copy engined/_kimi_helper.abi3.so from one): build "
            "it, or give the GPU every expert (a larger --gpu-memory, no --cpu-moe or "
            "--n-cpu-moe)")
    return placed


@dataclass(frozen=True)
class MemoryPlan:
    placement: object  # weights/placement.Placement, or None: no routed experts
    budget: Budget      # what the device holds, against its cap
    in_ram: int         # a GPU model's routed experts kept in RAM (0 on the CPU)


def plan_memory(plan, config, device: str, max_context: int) -> MemoryPlan:
    """serve's and doctor's one plan: the placement, then the budget of the device part
    (--gpu-memory on CUDA, --memory-cap on the CPU). Raises PlacementError when it cannot fit."""
    placement = place(plan, config, device, max_context)
    on_cuda = device.startswith("cuda")
    in_ram = placement.ram.get("routed experts", 0) if placement and on_cuda else 0
    cached = placement.gpu.get("expert cache", 0) if placement else 0
    cap = config.gpu_memory if on_cuda else config.memory_cap
    return MemoryPlan(placement, plan_budget(plan, max_context, cap, device, in_ram, cached),
                      in_ram)


def check_host(in_ram: int, requested_cap: int):
    """A GPU model's routed experts kept in RAM, against --memory-cap and the cgroup limit."""
    cap, source = effective_cap(requested_cap)
    if cap and in_ram > cap:
        raise MemoryCapError(
            f"refusing to start: the routed experts kept in RAM take {format_size(in_ram)}, "
            f"over the {format_size(cap)} cap ({source}). Raise --gpu-memory so fewer "
            "experts leave the GPU, or raise --memory-cap.")


def enforce(budget: Budget):
    """Refuse an over-cap plan; otherwise arm the counter and reserve the weights and the
    prefill's room (so the prefix cache and the sequences' KV never take it)."""
    if budget.is_over_cap:
        raise MemoryCapError(
            f"refusing to start: the memory plan exceeds the cap: {budget.describe()}. "
            + ("Lower --max-context or --max-batch, or free GPU memory (other processes) or "
               "raise --gpu-memory." if budget.cap_source == "--gpu-memory"
               or budget.cap_source.startswith("free memory of")  # cuda_cap's sources
               else "Lower --max-context, or raise --memory-cap."))
    arm(budget.cap_bytes)
    reserve(budget.weight_bytes + budget.prefill_bytes)


MemoryCapExceeded = helper.MemoryCapExceeded  # whichever counter refused


class Reservations:
    """csrc's memcap_* in Python, for a process without the C helper: bytes reserved against
    a cap (0 = none), and the peak."""

    def __init__(self):
        self._lock = threading.Lock()
        self.cap = self.used = self.peak = 0

    def arm(self, cap_bytes: int):
        with self._lock:
            self.cap, self.used, self.peak = int(cap_bytes), 0, 0

    def reserve(self, nbytes: int):
        with self._lock:
            if self.cap and self.used + nbytes > self.cap:
                raise MemoryCapExceeded(f"reserve({nbytes}): memory cap exceeded")
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def release(self, nbytes: int):
        with self._lock:
            if nbytes > self.used:
                raise ValueError(f"release({nbytes}): only {self.used} bytes are reserved")
            self.used -= nbytes


_reservations = Reservations()  # the process-wide counter when the helper is not built


def arm(cap_bytes: int):
    """Start counting against `cap_bytes` (0 = no cap) from zero."""
    if helper.available():
        return helper.memcap_init(cap_bytes)
    _reservations.arm(cap_bytes)


def reserve(nbytes: int):
    """Count `nbytes` more, or raise MemoryCapExceeded."""
    if helper.available():
        return helper.memcap_reserve(nbytes)
    _reservations.reserve(nbytes)


def release(nbytes: int):
    if helper.available():
        return helper.memcap_release(nbytes)
    _reservations.release(nbytes)


def reserved() -> int:
    """Bytes reserved now: the weights plus the running sequences' and cached prefixes' KV."""
    return helper.memcap_reserved() if helper.available() else _reservations.used
