"""Kernel registry: one `reference` per op, any number of variants checked against it.

Selection order for `resolve(op, device)`: programmatic override (`using`) -> KIMI_KERNELS
(`op=variant,...`; entries for ops not registered are ignored) -> the shipped default for
the device -> reference. `resolve` refuses a variant that does not declare the device.
Triton variants register through `lazy`, so a CPU-only run never imports triton.
"""
import contextlib
import importlib
import os
from dataclasses import dataclass, field
from typing import Callable

REFERENCE = "reference"


@dataclass(frozen=True)
class Variant:
    name: str
    fn: Callable
    devices: frozenset[str]  # e.g. {"cpu"}, {"cuda"}, {"cpu", "cuda"}
    description: str = ""


@dataclass
class Op:
    name: str
    variants: dict[str, Variant] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)  # device -> variant name


_OPS: dict[str, Op] = {}
_OVERRIDES: dict[str, str] = {}
_STAND_INS: dict[str, str] = {}  # device -> the device whose variants it runs (`standing_in`)


class KernelError(ValueError):
    """Unknown op or variant, a duplicate registration, or a variant on the wrong device."""


def register(op: str, name: str, devices=("cpu", "cuda"), description: str = ""):
    """Decorator: register `fn` as variant `name` of `op`. Exactly one `reference` per op."""
    def wrap(fn):
        entry = _OPS.setdefault(op, Op(op))
        if name in entry.variants:
            raise KernelError(f"{op}: variant {name!r} registered twice")
        entry.variants[name] = Variant(name, fn, frozenset(devices), description)
        return fn
    return wrap


def lazy(target: str) -> Callable:
    """A function that imports "module:attr" on its first call, then forwards to it.

    Triton variants register this way: importing triton costs a second on a CPU-only
    run, and kernels decorated before a test sets TRITON_INTERPRET=1 would be
    compiled-mode kernels that cannot take CPU tensors."""
    module, _, attr = target.partition(":")
    found: list[Callable] = []

    def forward(*args, **kwargs):
        if not found:
            found.append(getattr(importlib.import_module(module), attr))
        return found[0](*args, **kwargs)

    forward.__name__ = forward.__qualname__ = attr
    forward.__doc__ = f"{target}, imported on first call"
    return forward


def set_default(op: str, device: str, name: str):
    _variant(op, name)
    _OPS[op].defaults[device] = name


def _variant(op: str, name: str) -> Variant:
    entry = _OPS.get(op)
    if entry is None:
        raise KernelError(f"unknown op {op!r} (known: {', '.join(sorted(_OPS))})")
    if name not in entry.variants:
        raise KernelError(f"{op}: unknown variant {name!r} (known: {', '.join(sorted(entry.variants))})")
    return entry.variants[name]


def parse_env(text: str | None) -> dict[str, str]:
    """KIMI_KERNELS syntax: comma-separated op=variant; whitespace trimmed."""
    choices = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        op, sep, name = (s.strip() for s in item.partition("="))
        if not sep or not op or not name:
            raise KernelError(f"KIMI_KERNELS entry {item!r} is not op=variant")
        choices[op] = name
    return choices


def selected_name(op: str, device: str) -> str:
    if op in _OVERRIDES:
        return _OVERRIDES[op]
    env = parse_env(os.environ.get("KIMI_KERNELS"))
    if op in env:
        return env[op]
    _variant(op, REFERENCE)
    return _OPS[op].defaults.get(device, REFERENCE)


def resolve(op: str, device: str = "cpu") -> Variant:
    """The variant to run for `op` on `device`; refuses one that cannot run there."""
    device = runs_as(device)
    variant = _variant(op, selected_name(op, device))
    if device not in variant.devices:
        raise KernelError(f"{op}: variant {variant.name!r} runs on {sorted(variant.devices)}, "
                          f"not {device}")
    return variant


def runs_as(device: str) -> str:
    """The device whose variants `device` runs now (itself, unless standing_in)."""
    return _STAND_INS.get(device, device)


def variants(op: str) -> dict[str, Variant]:
    _variant(op, REFERENCE)
    return dict(_OPS[op].variants)


def ops() -> list[str]:
    return sorted(_OPS)


def standing_in(device: str, for_device: str):
    """While active, `resolve(op, device)` returns what `resolve(op, for_device)` would: the
    CUDA decode path run on CPU tensors, its Triton variants under TRITON_INTERPRET=1 (the
    kernel counter, bench/kernel_count.py, and the equivalence of the whole GPU step)."""
    return _entry_set(_STAND_INS, device, for_device)


def using(op: str, name: str):
    """Temporarily select `name` for `op` (tests and benchmarks)."""
    _variant(op, name)
    return _entry_set(_OVERRIDES, op, name)


@contextlib.contextmanager
def _entry_set(table: dict[str, str], key: str, value: str):
    """table[key] = value for the duration; the entry before it comes back after."""
    previous = table.get(key)
    table[key] = value
    try:
        yield
    finally:
        if previous is None:
            table.pop(key, None)
        else:
            table[key] = previous
