"""The kernels a serve will run, settled once at start, before the first request.

The shipped CPU defaults of the INT4 ops are their cpu_c variants, which call the compiled C
helper. Without it (the GPU image, or a checkout where `make setup` did not run) a CPU serve
runs those ops' reference variants instead (correct but slower) and the start log says
so. An op that KIMI_KERNELS pins to a helper variant is refused at start, not at the first
request. On CUDA the defaults are Triton and nothing changes.
"""
from engined import helper
from engined.ops import registry

HELPER_VARIANTS = frozenset({"cpu_c"})  # the variants that call engined.helper


def settle(device: str) -> list[str]:
    """Make every op runnable on `device` without a missing helper: the ops whose default
    needed it now default to their reference variant; returns those ops' names."""
    if helper.available():
        return []
    moved = []
    for op in registry.ops():
        if registry.selected_name(op, device) not in HELPER_VARIANTS:
            continue
        registry.set_default(op, device, registry.REFERENCE)
        pinned = registry.selected_name(op, device)
        if pinned in HELPER_VARIANTS:
            raise registry.KernelError(f"KIMI_KERNELS selects {op}={pinned}, which needs the C "
                                       f"helper: {missing()} (or select {op}=reference)")
        moved.append(op)
    return moved


def describe_fallback(moved: list[str]) -> str:
    return (f"{', '.join(moved)} run their reference kernels on the CPU (correct but "
            f"slower): {missing()}")


def missing() -> str:
    """Why the C helper is not available ("" when it is)."""
    try:
        helper.require()
    except helper.HelperError as exc:
        return str(exc)
    return ""
