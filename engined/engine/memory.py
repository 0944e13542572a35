"""The memory budget, planned before any weight is loaded: weights + KV for --max-context.

A plan over the cap refuses the start with the budget spelled out. Under the cap, the C
helper's counter is armed with it: the weights are reserved at start and each running
sequence reserves its own KV slots (engine/loop.py), so the plan is also what is enforced.
What the kernel will actually grant is read here too: the cgroup limit (v2 memory.max, v1
memory.limit_in_bytes) lowers the cap, so the engine refuses a plan cleanly instead of being
OOM-killed half-way through loading; `current_rss` is what this process already holds.
"""
import os
import pathlib
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

    @property
    def kv_bytes(self) -> int:
        return self.kv_bytes_per_token * self.max_context

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def is_over_cap(self) -> bool:
        return bool(self.cap_bytes) and self.total_bytes > self.cap_bytes

    def describe(self) -> str:
        cap = f"{format_size(self.cap_bytes)} ({self.cap_source})" if self.cap_bytes else "none"
        return (f"weights {format_size(self.weight_bytes)} + KV cache "
                f"{format_size(self.kv_bytes)} ({self.max_context} tokens x "
                f"{format_size(self.kv_bytes_per_token)}) = {format_size(self.total_bytes)}; "
                f"cap {cap}")


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


def plan_budget(plan, max_context: int, requested_cap: int) -> Budget:
    """plan: loader.LoadPlan (weight_bytes, kv_bytes_per_token)."""
    cap, source = effective_cap(requested_cap)
    return Budget(int(plan.weight_bytes), int(plan.kv_bytes_per_token), max_context, cap, source)


def enforce(budget: Budget):
    """Refuse an over-cap plan; otherwise arm the helper's counter and reserve the weights."""
    if budget.is_over_cap:
        raise MemoryCapError(
            f"refusing to start: the memory plan exceeds the cap: {budget.describe()}. "
            "Lower --max-context, or raise --memory-cap.")
    helper.memcap_init(budget.cap_bytes)
    helper.memcap_reserve(budget.weight_bytes)
