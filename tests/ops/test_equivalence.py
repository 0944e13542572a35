"""Every registered variant of every op against its plain fp32 reference.

Awkward shapes (M = 1, 3, 8 and more; N, K not powers of two; N = 1; odd group
counts; group sizes 16/32/64), fresh random inputs, outputs pre-filled with NaN.
Triton variants run here under TRITON_INTERPRET=1, so their shapes stay small.
"""
import os
import sys

# The interpreter works only if TRITON_INTERPRET=1 was set before triton itself was
# imported (tl.zeros, tl.sum are jit functions decorated then). If another module
# imported triton first, the Triton cases run in a fresh child process instead.
from tests.ops.helpers import interpreter_ready  # noqa: E402  (imports no triton)

os.environ.setdefault("TRITON_INTERPRET", "1")
TRITON_TOO_EARLY = "triton" in sys.modules and not interpreter_ready()

import pytest  # noqa: E402
import torch  # noqa: E402

from engined import ops  # noqa: E402,F401  (registers every variant)
from engined.ops import registry  # noqa: E402
from tests.ops.helpers import CASES, SMALL_ENOUGH_FOR_INTERPRETER, gemv_case, run_fresh  # noqa: E402

# Variants the interpreter cannot run, and where they are checked instead
NOT_INTERPRETABLE = {
    ("kda_prefill", "fla"): "fla-core's chunk_gated_delta_rule_fwd_kernel_h calls .to() on a loop "
    "counter, a Python int under TRITON_INTERPRET=1; tests/ops/test_kda_prefill.py checks the "
    "adapter with fla's naive functions standing in, and on a GPU against the real kernel",
}


def _params():
    for op in registry.ops():
        for name, variant in sorted(registry.variants(op).items()):
            if name == registry.REFERENCE:
                continue
            interpreted = "cpu" not in variant.devices
            if interpreted and TRITON_TOO_EARLY:
                continue  # see test_triton_variants_in_a_fresh_process
            if (op, name) in NOT_INTERPRETABLE:
                continue
            for case in CASES[op]:
                if interpreted and not SMALL_ENOUGH_FOR_INTERPRETER(case):
                    continue
                if interpreted and case.group and (case.group < 8 or case.group & (case.group - 1)):
                    continue  # Triton's INT4 tiles are whole code words: power-of-two groups >= 8
                if case.gpu_order and "cuda" not in variant.devices:
                    continue  # the CPU's kernels read the disk's order only
                yield pytest.param(op, name, case, id=f"{op}-{name}-{case.id}")


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float):
    assert got.shape == want.shape and got.dtype == want.dtype  # the reference sets the dtype
    assert torch.isfinite(got).all(), "non-finite output: a store was skipped"
    bad = (got - want).abs() > atol + rtol * want.abs()
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} outside tolerance; "
                           f"max |diff| {float((got - want).abs().max()):.3g}")


def call(fn, args, case, **kw):
    """fn on fresh copies of the arguments the op updates in place -> (output, those copies)."""
    args = [copy(a) if i in case.updates else a for i, a in enumerate(args)]
    return fn(*args, **kw), [args[i] for i in case.updates]


def copy(arg):
    """A tensor, or a list of them (llama_decode_layer's per-row caches)."""
    return [t.clone() for t in arg] if isinstance(arg, list) else arg.clone()


def each(arg) -> list[torch.Tensor]:
    return arg if isinstance(arg, list) else [arg]


@pytest.mark.parametrize("op,name,case", list(_params()))
def test_variant_matches_reference(op, name, case):
    gen = torch.Generator().manual_seed(case.seed)
    args = case.make(gen)
    want, want_updated = call(registry.variants(op)[registry.REFERENCE].fn, args, case)
    out = torch.full_like(want, float("nan"))
    got, updated = call(registry.variants(op)[name].fn, args, case, out=out)
    assert got.data_ptr() == out.data_ptr(), "variant ignored the out buffer"
    assert_close(got, want, atol=case.atol, rtol=case.rtol)
    for mine, theirs in zip(updated, want_updated):   # in-place updates (state pools, caches)
        for got_part, want_part in zip(each(mine), each(theirs), strict=True):
            # an fp16 store of a float32 sum taken in another order may round to the
            # neighbouring half: one fp16 step (2**-10 relative) on top of the case's tolerance
            rtol = max(case.rtol, 2.0 ** -10) if want_part.dtype == torch.float16 else case.rtol
            assert_close(got_part.float(), want_part.float(), atol=case.atol, rtol=rtol)
    fresh, _ = call(registry.variants(op)[name].fn, args, case)  # and with its own allocation
    assert_close(fresh, want, atol=case.atol, rtol=case.rtol)


def _gemm_variants():
    for name, variant in sorted(registry.variants("w4a16_gemm").items()):
        if "cpu" not in variant.devices and TRITON_TOO_EARLY:
            continue  # see test_triton_variants_in_a_fresh_process
        yield pytest.param(name, id=f"w4a16_gemm-{name}")


@pytest.mark.parametrize("name", list(_gemm_variants()))
def test_gemm_rounds_its_own_sums_into_a_16_bit_out(name):
    """Linear hands the prefill GEMM an out in the rows' 16-bit dtype (no cast kernel after it):
    each output is the variant's own fp32 sum rounded once, to nearest (a GPU, torch) or, in
    the Triton interpreter, toward zero."""
    fn = registry.variants("w4a16_gemm")[name].fn
    x, w = gemv_case(11, 40, 96, 32, torch.bfloat16, seed=10).make(torch.Generator().manual_seed(10))
    sums = fn(x, w)                                                    # fp32 [M, N]
    out = torch.full(sums.shape, float("nan"), dtype=torch.bfloat16)
    got = fn(x, w, out=out)
    assert got.data_ptr() == out.data_ptr() and sums.dtype == torch.float32
    nearest, toward_zero = sums.bfloat16(), (sums.view(torch.int32) & ~0xFFFF).view(torch.float32)
    assert ((got == nearest) | (got.float() == toward_zero)).all()


def test_every_op_has_cases_and_a_fast_variant():
    for op in registry.ops():
        assert CASES.get(op), f"{op} has no equivalence cases"
        assert set(registry.variants(op)) - {registry.REFERENCE}, f"{op} has only a reference"


@pytest.mark.skipif(not TRITON_TOO_EARLY, reason="the Triton cases ran in this process")
def test_triton_variants_in_a_fresh_process():
    run_fresh("tests/ops/test_equivalence.py", "triton")
