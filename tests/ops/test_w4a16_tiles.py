"""w4a16_tiles beyond equivalence (tests/ops/helpers.py's TILES cases run it against its
reference): the same bits from every kernel level (the portable C is the definition), every
batch and thread count, so a decode row, a verify step's rows and a prefill chunk's agree;
what it refuses; and the Kimi-Linear model's INT4 linears put into tiles at load."""
import pytest
import torch

from engined import helper
from engined.layers.linear import Linear
from engined.layers.moe import MoE
from engined.models import kimi_tiles
from engined.models.kimi_linear import int4_parts
from engined.ops import int4_format, registry
from engined.ops.int4_format import PackedInt4
from engined.ops.w4a16_gemv import cpu_c as w4a16_cpu_c
from engined.ops.w4a16_tiles import cpu_c
from engined.weights import loader
from tests.ops.helpers import random_int4
from tests.support.simd import int8_levels

level = int8_levels()


def tiled(n: int, k: int, group: int = 32, symmetric: bool = False, seed: int = 0):
    return int4_format.to_tiles(PackedInt4(group_size=group, **random_int4(
        torch.Generator().manual_seed(seed), n, k, group, symmetric=symmetric)))


@pytest.mark.parametrize("k,group,symmetric", [(576, 32, False), (672, 96, True)])
def test_every_level_batch_and_thread_count_gives_the_portable_bits(level, k, group, symmetric):
    w = tiled(112, k, group, symmetric, seed=k)
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(1)) * 3
    x[3, 40:72] *= 1e4                        # blocks of very different sizes
    counts = (1, 2, 3, 4, 5, 8, 9, 70)
    got = [cpu_c.w4a16_tiles(x[:rows], w) for rows in counts]
    for rows, out in zip(counts, got):        # a row's result whatever rows come with it
        assert torch.equal(out, got[-1][:rows]), rows
    try:
        w4a16_cpu_c.set_num_threads(1)
        assert torch.equal(cpu_c.w4a16_tiles(x, w), got[-1])
    finally:
        w4a16_cpu_c.set_num_threads(None)
    helper.w4a8_simd(0)                       # the portable C: the tile kernels' definition
    assert torch.equal(cpu_c.w4a16_tiles(x, w), got[-1])


def test_what_it_is_not_for_is_refused():
    rows = PackedInt4(group_size=32, **random_int4(torch.Generator().manual_seed(2), 32, 64, 32))
    x = torch.randn(2, 64)
    with pytest.raises(registry.KernelError, match="w4a16_tiles: the weight is not in tiles"):
        cpu_c.w4a16_tiles(x, rows)
    with pytest.raises(registry.KernelError, match="w4a16_gemv"):
        registry.variants("w4a16_gemv")["cpu_c"].fn(x, int4_format.to_tiles(rows))


@pytest.fixture(scope="module")
def kimi_int4(tmp_path_factory):
    from engined.weights.quantize import quantize_checkpoint
    from tests.support import kimi_tiny
    root = tmp_path_factory.mktemp("kimi-tiles")
    quantize_checkpoint(kimi_tiny.write_tiny_checkpoint(root / "src"), root / "int4",
                        progress=False)
    return root / "int4"


def test_a_kimi_model_loaded_for_the_cpu_runs_its_int4_linears_in_tiles(kimi_int4):
    """Every INT4 linear (q/k/v stacked with its views, o, MLA's, the shared experts' and the
    dense MLP's) in tiles, run by w4a16_tiles at any row count; the logits those of the row
    layout within the int16 rounding's cost (test_moe_grouped_int16.py's bound), and not the
    same; the fused decode (moe_decode's composed variant) runs a tiled shared expert as
    the layer's SwiGLU does."""
    from engined.weights.kimi_checkpoint import load_kimi_linear
    model = loader.load_model(str(kimi_int4), progress=False).model
    linears = [p for p in int4_parts(model) if isinstance(p, Linear)]
    assert linears and all(lin.packed.tiles for lin in linears)
    tokens = torch.arange(5, 21)
    got = model.forward(tokens, model.new_cache(16), 0, last_only=False)
    plain = load_kimi_linear(kimi_int4, progress=False).model         # rows, as checkpointed
    want = plain.forward(tokens, plain.new_cache(16), 0, last_only=False)
    assert 1e-7 < ((got - want).abs().mean() / want.abs().mean()).item() < 3e-4
    moe = next(layer.ffn for layer in model.layers if isinstance(layer.ffn, MoE))
    f = torch.randn(3, moe.w1.packed.shape[2], generator=torch.Generator().manual_seed(4))
    fused = moe(f)                                      # 3 decode rows: moe_decode, composed
    with registry.using("moe_decode", registry.REFERENCE):            # unrounded, float64
        exact = moe(f)
    assert ((fused - exact).abs() / exact.abs().amax(-1, keepdim=True)).max() < 5e-4
    assert kimi_tiles.tile_linears_(model) == 0         # once: nothing left to move


def test_views_that_forgot_their_base_are_moved_once():
    """A model built under inference_mode: its q/k/v views keep no _base, yet share the stacked
    linear's storage; tile_linears_ groups by storage, so it moves the bytes once (twice would
    scramble them) and the logits equal those of a model built outside it."""
    from engined.weights import synthetic
    tokens = torch.arange(3, 15)
    logits = []
    for inference in (False, True):
        with torch.inference_mode(inference):
            model = synthetic.build(synthetic.CONFIGS["tiny"], "cpu", seed=3)
            assert kimi_tiles.tile_linears_(model) > 0 and model.decode_gemv == "w4a16_tiles"
            logits.append(model.forward(tokens, model.new_cache(16), 0, last_only=False))
    assert torch.equal(logits[0], logits[1])


def test_linears_made_from_tiled_ones_keep_their_op_and_the_fused_decode_each_weights():
    """Rows of rows and stacks of tiled linears run the parts' op (w4a16_tiles, not the
    default w4a8_tiles); moe_decode's composed variant picks the op per weight, so a shared
    expert whose down projection tiles and whose gate/up does not still runs."""
    w = tiled(64, 96, seed=5)
    lin = Linear.from_packed(w)
    lin.select_gemv("w4a16_tiles")
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(6))
    want = cpu_c.w4a16_tiles(x, w)
    assert torch.equal(lin.rows(16, 48).rows(0, 16)(x), want[:, 16:32])
    assert torch.equal(Linear.stacked([lin.rows(0, 16), lin.rows(48, 64)])(x),
                       torch.cat([want[:, :16], want[:, 48:]], dim=1))
    from engined.ops.moe_decode.reference import composed
    from tests.ops.helpers import experts
    gen = torch.Generator().manual_seed(7)
    w1, w3, w2 = experts(gen, 4, 32, 64, 32), experts(gen, 4, 32, 64, 32), experts(gen, 4, 64, 32, 32)
    gate_up = PackedInt4(group_size=32, **random_int4(gen, 64, 64, 32, symmetric=True))
    down = PackedInt4(group_size=32, **random_int4(gen, 64, 32, 32, symmetric=True))
    f, logits = torch.randn(2, 64, generator=gen), torch.randn(2, 4, generator=gen)
    args = (f, logits, torch.zeros(4), 2, True, 1.0, w1, w3, w2)
    mixed = composed(*args, gate_up, int4_format.to_tiles(down))
    exact = registry.variants("moe_decode")[registry.REFERENCE].fn(*args, gate_up, down)
    assert ((mixed - exact).abs() / exact.abs().amax(-1, keepdim=True)).max() < 5e-4
