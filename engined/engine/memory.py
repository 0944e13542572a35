"""The memory budget, planned before any weight is loaded: weights + KV for --max-context.

A plan over the cap refuses the start with the budget spelled out. Under the cap, the C
helper's counter is armed with it: the weights are reserved at start and each running
sequence reserves its own KV slots (engine.py), so the plan is also what is enforced.
"""
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


def effective_cap(requested: int) -> tuple[int, str]:
    """The requested cap, lowered to the cgroup's memory.max when the helper can read it."""
    read_cgroup = getattr(helper, "effective_cap", None)
    if read_cgroup is None:
        return requested, "--memory-cap"
    cap = int(read_cgroup(requested) or 0)
    if cap and (not requested or cap < requested):
        return cap, "cgroup memory.max"
    return requested, "--memory-cap"


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
