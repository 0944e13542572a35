"""W4A8 routed experts (--moe-w4a8): the quality gate, and where the choice takes effect.

The gate, teacher-forced on the tiny real-format checkpoint quantized by our quantizer: the
INT4 model runs a prompt; at each MoE layer its FFN inputs are kept, and the routed experts
run on them three ways with the same routing: W4A16 (moe_grouped), W4A8 (moe_grouped_w4a8)
and the BF16 source's dense experts. The bound comes from the INT4 error itself: symmetric
INT4 rounds each weight on a grid of absmax/7, int8 rounds each activation on one of
absmax/127, so one activation rounding is 7/127 the size of a weight rounding; W4A8 rounds
twice (the input, then the SwiGLU output), so its change to the output must stay under
2 x 7/127 of the INT4 weights' own error against BF16. That adds the two roundings' sizes: a
heuristic, not a proof. The tiny model's activations are near Gaussian; real hidden states
have outlier channels, which raise int8's step for their block: the gate also runs with
every 37th channel five times larger (at 20 times, W4A8 reaches the bound)."""
import dataclasses

import pytest
import torch

from engined import helper
from engined.layers.moe import MoE
from engined.models import kimi_tiles
from engined.ops import registry
from engined.weights import loader
from engined.weights.kimi_checkpoint import build_empty, load_kimi_linear, load_weights, open_checkpoint
from engined.weights.quantize import quantize_checkpoint
from tests.support import kimi_tiny

pytestmark = pytest.mark.skipif(not helper.available(), reason="the C helper is not built: "
                                "W4A8 experts are its kernels (make setup)")
BOUND = 2 * 7 / 127


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("w4a8")
    src = kimi_tiny.write_tiny_checkpoint(root / "src")
    quantize_checkpoint(src, root / "int4", progress=False)
    ckpt = open_checkpoint(src)
    bf16 = build_empty(ckpt, "cpu", torch.float32, torch.float32)
    load_weights(ckpt, bf16, progress=False)
    return root / "int4", bf16


def ffn_inputs(model, tokens) -> dict[int, torch.Tensor]:
    """Each MoE layer's FFN input rows over a teacher-forced prefill of `tokens`."""
    seen: dict[int, list] = {}
    layers = {id(layer.ffn): i for i, layer in enumerate(model.layers)}
    call = MoE.__call__

    def keep(moe, f):
        seen.setdefault(layers[id(moe)], []).append(f.clone())
        return call(moe, f)
    MoE.__call__ = keep
    try:
        model.forward(tokens, model.new_cache(len(tokens)), 0, last_only=False)
    finally:
        MoE.__call__ = call
    return {i: torch.cat(fs) for i, fs in seen.items()}


@pytest.mark.parametrize("outliers", [1.0, 5.0])
def test_w4a8_experts_stay_within_the_bound_derived_from_the_int4_error(pair, outliers):
    int4_dir, bf16 = pair
    model = load_kimi_linear(int4_dir, progress=False).model
    tokens = torch.randint(0, 300, (64,), generator=torch.Generator().manual_seed(2))
    w4a16, w4a8 = (registry.resolve(op, "cpu").fn for op in ("moe_grouped", "moe_grouped_w4a8"))
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    inputs = ffn_inputs(model, tokens)
    assert len(inputs) == 3                                 # layers 1..3 are MoE
    for i, f in inputs.items():
        f[:, ::37] *= outliers
        moe = model.layers[i].ffn
        experts, weights = moe.route_rows(f)
        banks = (moe.w1.packed, moe.w3.packed, moe.w2.packed)
        y16, y8 = w4a16(f, *banks, experts, weights), w4a8(f, *banks, experts, weights)
        y8_tiles = w4a8(f, *(bank.to_tiles() for bank in banks), experts, weights)  # served
        dense = bf16.layers[i].ffn._dense(f, experts, weights)
        int4_error, w4a8_change = rel(y16, dense), max(rel(y8, y16), rel(y8_tiles, y16))
        print(f"layer {i}: INT4 error {int4_error:.4f}, W4A8 change {w4a8_change:.4f} "
              f"({w4a8_change / int4_error:.3f} of it; bound {BOUND:.3f})")
        assert 0 < w4a8_change <= BOUND * int4_error, (i, w4a8_change, int4_error)


def test_the_choice_reaches_every_cpu_run_expert(pair, monkeypatch):
    """--moe-w4a8 through the loader: decode rows (which otherwise take the fused moe_decode)
    and prefill rows run moe_grouped_w4a8, on a model with experts in RAM too; without it,
    never."""
    calls = []
    variant = registry.variants("moe_grouped_w4a8")["cpu_c"]
    monkeypatch.setitem(registry._OPS["moe_grouped_w4a8"].variants, "cpu_c", dataclasses.replace(
        variant, fn=lambda *a, **k: calls.append(a[0].shape[0]) or variant.fn(*a, **k)))
    for spec, offload in ((str(pair[0]), frozenset()), ("synthetic:tiny", frozenset({1}))):
        for w4a8 in (False, True):
            calls.clear()
            model = loader.load_model(spec, progress=False, offload=offload, moe_w4a8=w4a8).model
            cache = model.new_cache(16)
            model.forward(torch.arange(5, 17), cache, 0)                       # 12 rows
            model.decode_batch(torch.tensor([3]), [cache], [12])               # 1 row
            layers = sum(isinstance(layer.ffn, MoE) for layer in model.layers) if w4a8 else 0
            assert calls.count(12) == calls.count(1) == layers and len(calls) == 2 * layers, (
                spec, w4a8, calls)


def test_models_without_int4_experts_in_groups_of_32_refuse_it(tmp_path):
    with pytest.raises(loader.ModelLoadError, match="--moe-w4a8: .*are not INT4"):
        loader.load_model(str(kimi_tiny.write_tiny_checkpoint(tmp_path / "bf16")), progress=False,
                          moe_w4a8=True)
    quantize_checkpoint(tmp_path / "bf16", tmp_path / "g16", group_size=16, progress=False)
    with pytest.raises(loader.ModelLoadError, match="groups of 16: drop --moe-w4a8, or re-quantize"):
        loader.load_model(str(tmp_path / "g16"), progress=False, moe_w4a8=True)
    with pytest.raises(loader.ModelLoadError, match="--moe-w4a8: model 'default' has no routed experts"):
        loader.load_model("default", progress=False, moe_w4a8=True)


def test_doctor_refuses_it_from_the_plan_as_serve_does(pair, tmp_path):
    from engined.commands.doctor import check_memory_plan
    from engined.config import EngineConfig
    bf16 = kimi_tiny.write_tiny_checkpoint(tmp_path / "bf16")
    refused = check_memory_plan(EngineConfig(model=str(bf16), device="cpu", moe_w4a8=True))
    assert not refused.is_ok and "--moe-w4a8: W4A8 routed experts need the INT4 artifact" in refused.detail
    assert check_memory_plan(EngineConfig(model=str(pair[0]), device="cpu", moe_w4a8=True)).is_ok


def test_both_ops_read_the_cpu_banks_in_tiles_and_the_reference_reads_rows_again(pair):
    """Loaded for the CPU, every routed bank is in the CPU's tiles, W4A16 (the default) and
    W4A8 (--moe-w4a8) alike (csrc/kimi_moe_tiles.c); each gives what its op gives on the row
    layout (the same rounding, other float sums), compared layer by layer on one model's FFN
    inputs: through the whole model a near-tie in the tiny router's top-k can flip on a
    difference of 1e-6. Choosing an op whose CPU variant is not the C helper's puts them back,
    the same bytes: the model then gives a fresh model's bits."""
    tokens = torch.arange(5, 21)

    def logits(model):
        return model.forward(tokens, model.new_cache(len(tokens)), 0, last_only=False)
    def banks_of(model):
        return [b for layer in model.layers if isinstance(layer.ffn, MoE)
                for b in (layer.ffn.w1, layer.ffn.w3, layer.ffn.w2)]
    for w4a8 in (True, False):
        model, rows = (loader.load_model(str(pair[0]), progress=False, moe_w4a8=w4a8).model
                       for _ in range(2))
        assert banks_of(model) and all(b.packed.tiles for b in banks_of(model))
        for bank in banks_of(rows):                         # the same op on the row layout
            bank.to_tiles_(back=True)
        moes = [(a.ffn, b.ffn) for a, b in zip(model.layers, rows.layers) if isinstance(a.ffn, MoE)]
        for (tiled_moe, rows_moe), f in zip(moes, ffn_inputs(model, tokens).values()):
            tiled, plain = tiled_moe(f), rows_moe(f)
            if w4a8:                                        # one rounding, other float sums
                torch.testing.assert_close(tiled, plain, atol=1e-4, rtol=1e-5)
            else:   # rows of 32 take the float dots, tiles round x and h to int16: its cost
                # (test_moe_grouped_int16.py's bound), and not nothing
                assert 1e-7 < ((tiled - plain).abs().mean() / plain.abs().mean()).item() < 3e-4
    banks = banks_of(model)
    fresh = load_kimi_linear(pair[0], progress=False).model     # not through the loader: rows
    assert not any(b.packed.tiles for b in banks_of(fresh))
    kimi_tiles.tile_linears_(fresh)                             # the loader's linears
    with registry.using("moe_grouped", registry.REFERENCE):
        want = logits(fresh)
        model.select_experts("moe_grouped")
        assert not any(b.packed.tiles for b in banks)
        assert torch.equal(logits(model), want)
    for mine, theirs in zip(banks, banks_of(fresh)):
        assert torch.equal(mine.qweight, theirs.qweight) and torch.equal(mine.scales, theirs.scales)


def test_a_model_whose_experts_are_all_on_a_gpu_asks_nothing_of_the_cpu_variants():
    """The loader chooses the CPU's experts on every Kimi load: a model with every bank on
    its GPU (here the meta device) must not resolve the CPU variant, which a CUDA-only pick
    in KIMI_KERNELS (moe_grouped=triton_dot) would refuse."""
    from engined.weights import synthetic
    model = synthetic.build(synthetic.CONFIGS["tiny"], "meta", fill=False)
    with registry.using("moe_grouped", "triton_dot"):
        model.select_experts("moe_grouped", required=False)
    assert not any(b.packed.tiles for layer in model.layers if isinstance(layer.ffn, MoE)
                   for b in (layer.ffn.w1, layer.ffn.w3, layer.ffn.w2))
