"""The kernel counter: how many GPU kernels one Kimi-Linear decode step launches, found on the CPU.

It runs the CUDA code path on CPU tensors: the registry resolves every op as it would on CUDA
(registry.standing_in), the Triton variants run under TRITON_INTERPRET=1, each Triton launch
is counted once (whatever its grid), and every aten op that would launch a kernel is counted
by a TorchDispatchMode (views, `empty` and other metadata-only ops launch none). The model is
synthetic:kimi-linear-48b-tiny: the 48B's 27 layers and their KDA/MLA/MoE map at tiny widths,
with bf16 activations as on a GPU; a kernel's count does not depend on the widths.

    .venv/bin/python bench/model_step.py --count-kernels     # by layer and op, then the totals

On a GPU the profiler's count of one graph replay (bench/gpu_quick.py) should equal this.
"""
import collections
import contextlib
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from engined import ops  # noqa: E402,F401  (registers every variant)
from engined.models.kimi_graph_step import KimiGraphStep  # noqa: E402
from engined.models.latent_pool import num_blocks_for  # noqa: E402
from engined.ops import registry  # noqa: E402
from engined.weights import synthetic  # noqa: E402

MODEL = "kimi-linear-48b-tiny"
PREFILL_CHUNK = 256
# aten ops that allocate or describe memory without running a kernel
ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}
NO_KERNEL = ALLOCATIONS | {"detach", "lift_fresh", "alias", "set_", "resize_", "_reshape_alias",
                           "_unsafe_view"}


class Counts:
    """(where, what) -> launches; `where` is set by the caller (a layer, "embed", "head")."""

    def __init__(self):
        self.by = collections.Counter()
        self.where = "step"
        self.paused = 0

    def add(self, what: str):
        if not self.paused:
            self.by[(self.where, what)] += 1

    @property
    def total(self) -> int:
        return sum(self.by.values())

    def per_where(self) -> dict[str, int]:
        out = collections.Counter()
        for (where, _), n in self.by.items():
            out[where] += n
        return dict(out)


class AtenKernels(TorchDispatchMode):
    """Counts each aten call that launches a kernel (a view or an allocation launches none)."""

    def __init__(self, counts: Counts, zero_fill: bool = False):
        super().__init__()
        self.counts = counts
        self.zero_fill = zero_fill   # allocations zeroed: what kernels not run leave is finite

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
            with self:                                  # einsum, linear, matmul: what they run
                done = func.decompose(*args, **kwargs)
            if done is not NotImplemented:
                return done
        name = func.overloadpacket.__name__
        if not (func.is_view or name in NO_KERNEL):
            self.counts.add(f"aten.{name}")
        out = func(*args, **kwargs)
        if self.zero_fill and name in ALLOCATIONS:
            out.zero_()                                 # not counted: the mode is off in here
        return out


@contextlib.contextmanager
def triton_launches(counts: Counts, execute: bool = True):
    """Counts every interpreted Triton launch by kernel name; the interpreter's own tensor
    work inside a launch is not a kernel of the step, so aten counting pauses there.
    execute=False counts without running the kernel (its outputs keep what they held, zeros
    under `counting`: a prefill chunk's count, where interpreting 256 rows of experts would
    take minutes, and no launch count depends on a kernel's values). An autotuned kernel
    (fla's) launches its first config without timing the others: a GPU times them once, not
    per step."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction

    original, bench = InterpretedFunction.run, Autotuner._bench

    def run(self, *args, **kwargs):
        counts.add(f"triton.{self.fn.__name__}")
        if not execute:
            return None
        counts.paused += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            counts.paused -= 1

    InterpretedFunction.run = run
    Autotuner._bench = lambda self, *args, config, **meta: [0.0, 0.0, 0.0]
    try:
        yield
    finally:
        InterpretedFunction.run, Autotuner._bench = original, bench


@contextlib.contextmanager
def counting(counts: Counts, execute: bool = True):
    """The CUDA path on CPU tensors, every launch counted."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the kernel counter needs TRITON_INTERPRET=1 before triton is imported")
    with (registry.standing_in("cpu", "cuda"), triton_launches(counts, execute),
          AtenKernels(counts, zero_fill=not execute)):
        yield


@contextlib.contextmanager
def labelled(model, counts: Counts):
    """Attributes each layer's launches to it: the layer class's decode_batch and __call__ are
    wrapped for the duration (a call goes through the class, not the instance)."""
    kinds = {id(layer): f"{i:2d} {'MLA' if layer.is_mla else 'KDA'}"
             for i, layer in enumerate(model.layers)}
    cls = type(model.layers[0])
    originals = {m: vars(cls)[m] for m in ("decode_batch", "__call__")}
    for method, fn in originals.items():
        setattr(cls, method, _label(fn, counts, kinds))
    try:
        yield
    finally:
        for method, fn in originals.items():
            setattr(cls, method, fn)


def _label(fn, counts: Counts, kinds: dict[int, str]):
    def wrapped(layer, *args, **kwargs):
        outer, counts.where = counts.where, kinds[id(layer)]
        try:
            return fn(layer, *args, **kwargs)
        finally:
            counts.where = outer
    return wrapped


def build(name: str = MODEL):
    """The synthetic model with the GPU's dtypes (bf16 activations and dense weights) on the CPU."""
    from engined.models.kimi_linear import KimiLinearModel
    from engined.models.kimi_linear_config import parse_config

    config = parse_config(synthetic.CONFIGS[name])
    model = KimiLinearModel(config, torch.bfloat16, "cpu", synthetic.selective_int4(config),
                            torch.bfloat16)
    synthetic.fill_random(model, seed=0)
    return model


@torch.inference_mode()
def decode_step(model, rows: int = 1, execute: bool = False) -> Counts:
    """The launches of one decode step of `rows` rows: the step a CUDA graph captures
    (models/kimi_graph_step.py), run once to warm it (MLA's absorbed weights are made then),
    then once counted. Triton kernels are counted, not run, unless `execute` (the step holds
    no host sync, so no launch depends on a value)."""
    step = KimiGraphStep(model, rows, num_blocks_for(64))
    counts = Counts()
    with counting(counts, execute):
        step.run()
        counts.by.clear()
        with labelled(model, counts):
            step.run()
    return counts


@torch.inference_mode()
def prefill_chunk(model, tokens: int = PREFILL_CHUNK) -> Counts:
    """The launches of one prefill chunk of `tokens` tokens through the whole model (Triton
    kernels counted, not run: what they would write is left zeroed, so the router's picks,
    which torch ops sort, are expert 0)."""
    cache = model.new_cache(tokens)
    ids = torch.arange(tokens) % model.config.vocab_size
    counts = Counts()
    with counting(counts, execute=False), labelled(model, counts):
        model.forward(ids, cache, 0)
    return counts


def report(decode: Counts, prefill: Counts | None) -> list[str]:
    """By layer and op, then the two total lines the gates read."""
    lines = ["| where | op | kernels |", "|---|---|---:|"]
    for (where, what), n in sorted(decode.by.items()):
        lines.append(f"| {where} | {what} | {n} |")
    lines.append("")
    lines.append("per layer: " + ", ".join(f"{w.strip()}={n}" for w, n in
                                            sorted(decode.per_where().items())))
    lines.append(f"kernels per decode step: {decode.total}")
    if prefill is not None:
        widest = max(n for w, n in prefill.per_where().items() if w[:2].strip().isdigit())
        lines.append(f"kernels per prefill chunk per layer: {widest}")
    return lines
