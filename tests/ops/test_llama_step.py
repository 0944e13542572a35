"""A decode step's Llama layers in one C call (llama_decode_step, the model's path through
all_layers) against one C call per layer (llama_decode_layer): bit for bit, outputs and caches."""
import pytest
import torch

from engined import helper
from engined.helper import llama as helper_llama
from engined.ops import registry
from engined.ops.llama_decode_layer import cpu_c
from tests.ops.layer_cases import LLAMA_LAYER

CASE = LLAMA_LAYER[5]  # B = 3 at positions 7, 66, 2: caches of three sizes, W4A8


def fresh(case=CASE):
    return case.make(torch.Generator().manual_seed(case.seed))


def three_layers():
    return [CASE.make(torch.Generator().manual_seed(seed))[1] for seed in (10, 11, 12)]


def per_layer(h, layers, cos, sin, caches, positions):
    """The step as one llama_decode_layer call per layer, on copies: (h, caches) after it."""
    caches = [c.clone() for c in caches]
    h = h.clone()
    for i, layer in enumerate(layers):
        cpu_c.llama_decode_layer(h, layer, cos, sin, [c[i] for c in caches], positions, out=h)
    return h, caches


def test_the_step_wide_form_equals_one_call_per_layer():
    """Rows of three caches of different sizes (each layer's rows a different distance apart)."""
    layers = three_layers()
    h, _, cos, sin, kv, positions = fresh()
    caches = [torch.stack([c.clone() for _ in layers]) for c in kv]   # B x [L, 2, S, KVH, hd]
    want, want_caches = per_layer(h, layers, cos, sin, caches, positions)
    got = h.clone()
    assert cpu_c.llama_decode_layer.all_layers(got, layers, cos, sin, caches, positions) is got
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(caches, want_caches))


class Counting:
    """helper.llama's lib, counting the calls made through it by name."""

    def __init__(self, lib):
        self.lib, self.calls = lib, {}

    def __getattr__(self, name):
        fn = getattr(self.lib, name)
        if not callable(fn):
            return fn

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args)
        return counted


def test_a_verify_step_is_one_native_call_with_its_rows_sharing_their_cache(monkeypatch):
    """Rows 0-3 a verify step of one sequence (one cache, positions 20..23), row 4 another's:
    the C step's pointers per row and layer give the per-layer calls' bits, in one call."""
    from engined.layers.rope import RotaryEmbedding
    layers = three_layers()
    h = torch.randn((5, 96), generator=torch.Generator().manual_seed(3))
    mine = torch.randn((3, 2, 30, 3, 16), generator=torch.Generator().manual_seed(4)).half()
    other = torch.randn((3, 2, 9, 3, 16), generator=torch.Generator().manual_seed(5)).half()
    caches, positions = [mine] * 4 + [other], [20, 21, 22, 23, 7]
    cos, sin = (t.clone() for t in RotaryEmbedding(16, 10000.0).at_positions(positions))
    want_h, want_mine, want_other = h.clone(), mine.clone(), other.clone()
    for i, layer in enumerate(layers):
        kv = [want_mine[i]] * 4 + [want_other[i]]
        cpu_c.llama_decode_layer(want_h, layer, cos, sin, kv, positions, out=want_h)
    handles = [cpu_c.c_layer(layer) for layer in layers]   # built before counting
    counting = Counting(helper_llama.lib)
    monkeypatch.setattr(helper_llama, "lib", counting)
    helper.llama_decode_layers(handles, h, cos, sin, caches, positions, 2)
    assert counting.calls == {"llama_decode_step": 1}
    assert torch.equal(h, want_h)
    assert torch.equal(mine, want_mine) and torch.equal(other, want_other)


def test_a_failing_layer_stops_the_step_and_says_which():
    """The C call with a missing third layer: layers 0 and 1 ran, then KH_EINVAL and index 2."""
    from engined.helper.core import ffi, lib
    layers = three_layers()
    h, _, cos, sin, kv, positions = fresh()
    caches = [torch.stack([c.clone() for _ in layers]) for c in kv]
    want, _ = per_layer(h, layers[:2], cos, sin, [c[:2] for c in caches], positions)
    handles = [cpu_c.c_layer(layer) for layer in layers]
    owner = torch.empty(max(int(lib.llama_decode_layer_work_floats(x.struct, len(kv))) for x in handles))
    failed = ffi.new("int64_t *")
    ptr = lambda t, kind="float *": ffi.cast(kind, t.data_ptr())  # noqa: E731
    status = lib.llama_decode_step(
        ffi.new("KhLlamaLayer *[]", [handles[0].struct, handles[1].struct, ffi.NULL]), 3,
        ptr(h), len(kv), ptr(cos), ptr(sin),
        ffi.new("uint16_t *[]", [ptr(c, "uint16_t *") for c in caches]),
        ffi.new("int64_t[]", [c.stride(0) for c in caches]),
        ffi.new("int64_t[]", [c.stride(1) for c in caches]),
        ffi.new("int64_t[]", positions), ffi.NULL, 0.0, ffi.NULL, ptr(owner), 2, failed)
    assert (status, failed[0]) == (lib.KH_EINVAL, 2)
    assert torch.equal(h, want)


def test_the_final_norm_comes_after_the_layers_in_the_same_call():
    """final_norm: the step's h as without it, and its RMS norm (against float64) returned."""
    from engined.layers.rmsnorm import RMSNorm
    layers = three_layers()
    h, _, cos, sin, kv, positions = fresh()
    caches = [torch.stack([c.clone() for _ in layers]) for c in kv]
    want, _ = per_layer(h, layers, cos, sin, caches, positions)
    norm = RMSNorm.from_weight(1 + 0.1 * torch.randn(96, generator=torch.Generator().manual_seed(6)), 1e-5)
    got = h.clone()
    normed = cpu_c.llama_decode_layer.all_layers(got, layers, cos, sin, caches, positions,
                                                 final_norm=norm)
    assert torch.equal(got, want)
    x = want.double()
    plain = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    assert torch.allclose(normed.double(), plain, rtol=1e-6, atol=1e-6)
    with pytest.raises(registry.KernelError, match=r"final_norm must be a contiguous CPU fp32 \[96\]"):
        cpu_c.llama_decode_layer.all_layers(h, layers, cos, sin, caches, positions,
                                            final_norm=RMSNorm.from_weight(torch.ones(95), 1e-5))


def test_the_c_step_refuses_layers_of_other_widths_and_a_norm_with_no_layers():
    """The final norm is over one width: a step whose layers differ in it is refused in C
    (the Python wrapper refuses it too), and a norm asked for with no layers in Python."""
    from engined.helper.core import ffi, lib
    from tests.ops.layer_cases import LLAMA_LAYER as cases
    wide = cpu_c.c_layer(cases[2].make(torch.Generator().manual_seed(2))[1])   # D 96
    narrow = cpu_c.c_layer(cases[0].make(torch.Generator().manual_seed(0))[1])  # D 64
    h = torch.zeros(1, 96)
    cache = torch.zeros(2, 2, 4, 2, 32, dtype=torch.float16)
    ptr = lambda t, kind="float *": ffi.cast(kind, t.data_ptr())  # noqa: E731
    failed = ffi.new("int64_t *")
    status = lib.llama_decode_step(
        ffi.new("KhLlamaLayer *[]", [wide.struct, narrow.struct]), 2, ptr(h), 1, ptr(h), ptr(h),
        ffi.new("uint16_t *[]", [ptr(cache, "uint16_t *")]), ffi.new("int64_t[]", [cache.stride(0)]),
        ffi.new("int64_t[]", [cache.stride(1)]), ffi.new("int64_t[]", [0]), ffi.NULL, 0.0,
        ffi.NULL, ptr(torch.zeros(1 << 16)), 1, failed)
    assert (status, failed[0]) == (lib.KH_EINVAL, -1)
    with pytest.raises(ValueError, match="a final norm needs the step's layers"):
        helper.llama_decode_layers([], h, h, h, [], [], 1, torch.ones(96), 1e-5)


def test_the_step_wide_form_refuses_a_cache_of_other_layers():
    h, layer, cos, sin, kv, positions = fresh()
    caches = [torch.stack([c, c]) for c in kv]  # 2 layers of cache for 3 layers of weights
    with pytest.raises(registry.KernelError, match=r"\[3, 2, S"):
        cpu_c.llama_decode_layer.all_layers(h, [layer] * 3, cos, sin, caches, positions)
