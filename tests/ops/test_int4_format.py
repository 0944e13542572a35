"""The packed-INT4 format: known-answer bytes (engined/ops/README.md's worked example),
round trips, metadata refusal, quantizer error bounds, and the C helper against the reference."""
import numpy as np
import pytest
import torch

from engined import helper
from engined.ops import int4_format as fmt

# engined/ops/README.md, "Worked example": one row, K = 8, G = 4.
EXAMPLE_CODES = [0, 1, 2, 3, 15, 14, 13, 12]
EXAMPLE_BYTES = [0x10, 0x32, 0xEF, 0xCD]
EXAMPLE_SCALES = [0.5, 0.25]
EXAMPLE_MINS = [-1.0, 2.0]
EXAMPLE_WEIGHTS = [-1.0, -0.5, 0.0, 0.5, 5.75, 5.5, 5.25, 5.0]
# The same codes and scales stored symmetric (no mins): w = s * (q - 8).
EXAMPLE_SYM_WEIGHTS = [-4.0, -3.5, -3.0, -2.5, 1.75, 1.5, 1.25, 1.0]


def example() -> fmt.PackedInt4:
    return fmt.PackedInt4(torch.tensor([EXAMPLE_BYTES], dtype=torch.uint8),
                          torch.tensor([EXAMPLE_SCALES], dtype=torch.float16),
                          torch.tensor([EXAMPLE_MINS], dtype=torch.float16), 4)


def symmetric_example() -> fmt.PackedInt4:
    p = example()
    return fmt.PackedInt4(p.qweight, p.scales, None, p.group_size)


def random_packed(n: int, k: int, g: int, seed: int = 0, symmetric: bool = False) -> fmt.PackedInt4:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    scales = (torch.rand(n, k // g, generator=gen) * 0.1).half()
    mins = (torch.randn(n, k // g, generator=gen) * 0.1).half()
    return fmt.PackedInt4(fmt.pack_codes(codes), scales, None if symmetric else mins, g)


def _mins(p: fmt.PackedInt4):
    return None if p.mins is None else p.mins.numpy()


def test_worked_example_bytes_and_weights():
    packed = fmt.pack_codes(torch.tensor([EXAMPLE_CODES]))
    assert packed.tolist() == [EXAMPLE_BYTES]
    assert fmt.unpack_codes(packed).tolist() == [EXAMPLE_CODES]
    assert fmt.dequantize(example()).tolist() == [EXAMPLE_WEIGHTS]
    assert fmt.dequantize(symmetric_example()).tolist() == [EXAMPLE_SYM_WEIGHTS]


@pytest.mark.parametrize("symmetric", [False, True])
def test_c_helper_matches_worked_example(symmetric):
    p = symmetric_example() if symmetric else example()
    out = helper.unpack_int4(p.qweight.numpy(), p.scales.numpy(), _mins(p), p.group_size)
    assert out.tolist() == [EXAMPLE_SYM_WEIGHTS if symmetric else EXAMPLE_WEIGHTS]


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("n,k,g", [(1, 2, 2), (3, 64, 32), (5, 128, 64), (7, 96, 32), (4, 576, 32)])
def test_c_helper_is_bit_identical_to_reference(n, k, g, symmetric):
    p = random_packed(n, k, g, seed=n * k + g, symmetric=symmetric)
    out = helper.unpack_int4(p.qweight.numpy(), p.scales.numpy(), _mins(p), g)
    assert np.array_equal(out, fmt.dequantize(p).numpy())


def test_symmetric_equals_asymmetric_with_min_minus_eight_scales():
    """v2's symmetric linear is exactly v1's encoding of it (m = -8 s), stored smaller."""
    p = random_packed(6, 128, 32, seed=3, symmetric=True)
    asym = fmt.PackedInt4(p.qweight, p.scales, (-8 * p.scales.float()).half(), 32)
    assert torch.equal(fmt.dequantize(p), fmt.dequantize(asym))


def test_c_helper_rejects_bad_shapes():
    p = random_packed(2, 64, 32)
    with pytest.raises(ValueError, match="bad INT4 shapes"):
        helper.unpack_int4(p.qweight.numpy(), p.scales.numpy()[:, :1], p.mins.numpy(), 32)


@pytest.mark.parametrize("n,k", [(1, 2), (3, 10), (16, 64)])
def test_pack_unpack_round_trip(n, k):
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(k))
    packed = fmt.pack_codes(codes)
    assert packed.shape == (n, k // 2) and packed.dtype == torch.uint8
    assert torch.equal(fmt.unpack_codes(packed), codes.to(torch.uint8))


def test_pack_refuses_odd_k_and_out_of_range_codes():
    with pytest.raises(fmt.FormatError, match="even"):
        fmt.pack_codes(torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(fmt.FormatError, match="0..15"):
        fmt.pack_codes(torch.tensor([[16, 0]]))


def test_packed_int4_validates_shapes_and_dtypes():
    p = random_packed(2, 64, 32)
    with pytest.raises(fmt.FormatError, match="group size"):
        fmt.PackedInt4(p.qweight, p.scales, p.mins, 24)
    with pytest.raises(fmt.FormatError, match="scales must be fp16"):
        fmt.PackedInt4(p.qweight, p.scales.float(), p.mins, 32)
    with pytest.raises(fmt.FormatError, match="uint8"):
        fmt.PackedInt4(p.qweight.to(torch.int16), p.scales, p.mins, 32)


def test_metadata_round_trip_and_refusals():
    meta = fmt.metadata({"blk.0.attn_q": fmt.Int4Layout(32)})
    assert meta == {"kimi.format": "kimi-packed-int4", "kimi.format_version": "2",
                    "blk.0.attn_q.group_size": "32", "blk.0.attn_q.scheme": "asymmetric"}
    fmt.check_metadata(meta)
    state = fmt.to_state_dict("blk.0.attn_q", random_packed(2, 64, 32))
    assert fmt.from_state_dict("blk.0.attn_q", state, meta).group_size == 32
    with pytest.raises(fmt.FormatError, match="not a kimi-packed-int4 artifact"):
        fmt.check_metadata(None)
    with pytest.raises(fmt.FormatError, match="not a kimi-packed-int4 artifact"):
        fmt.check_metadata({**meta, fmt.FORMAT_KEY: "gptq"})
    with pytest.raises(fmt.FormatError, match="version '3' is not supported"):
        fmt.check_metadata({**meta, fmt.VERSION_KEY: "3"})
    with pytest.raises(fmt.FormatError, match="group size missing"):
        fmt.from_state_dict("blk.0.attn_q", state, fmt.metadata({}))


def test_version_1_is_refused_with_a_re_quantize_message():
    meta = {**fmt.metadata({"blk.0.attn_q": fmt.Int4Layout(32)}), fmt.VERSION_KEY: "1"}
    with pytest.raises(fmt.FormatError, match=r"version '1' is not supported .*re-quantize"):
        fmt.check_metadata(meta, "old.safetensors")


def test_symmetric_round_trip_has_no_mins_and_the_scheme_is_recorded():
    p = random_packed(2, 64, 32, symmetric=True)
    state = fmt.to_state_dict("w", p)
    assert sorted(state) == ["w.qweight", "w.scales"]
    meta = fmt.metadata({"w": p.layout})
    assert meta["w.scheme"] == "symmetric"
    back = fmt.from_state_dict("w", state, meta)
    assert back.symmetric and back.layout == fmt.Int4Layout(32, symmetric=True)
    # the metadata decides, never the tensors present or the name: disagreement is refused
    with pytest.raises(fmt.FormatError, match="says asymmetric but the artifact lacks w.mins"):
        fmt.from_state_dict("w", state, fmt.metadata({"w": fmt.Int4Layout(32)}))
    with_mins = fmt.to_state_dict("w", random_packed(2, 64, 32))
    with pytest.raises(fmt.FormatError, match="says symmetric but the artifact has w.mins"):
        fmt.from_state_dict("w", with_mins, meta)
    unrecorded = {k: v for k, v in meta.items() if k != "w.scheme"}
    with pytest.raises(fmt.FormatError, match="scheme None"):
        fmt.from_state_dict("w", state, unrecorded)



def grouped(t: torch.Tensor, g: int) -> torch.Tensor:
    return t.view(t.shape[0], -1, g)


@pytest.mark.parametrize("g", [32, 64])
def test_quantize_asym_error_is_at_most_half_a_step(g):
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(g)) * 0.05 + 0.01
    p = fmt.quantize_asym(w, g)
    err = grouped((fmt.dequantize(p) - w).abs(), g).amax(-1)  # [N, K/G]
    wmax = grouped(w.abs(), g).amax(-1)
    # Rounding costs at most s/2; fp16 rounding of s (rel 2^-11, times up to 15 codes) and of
    # the min (rel 2^-11 of |w|) add at most ~1% of a step plus 1e-3 |w|.
    bound = 0.51 * p.scales.float() + 1e-3 * wmax
    assert bool((err <= bound).all()), float((err - bound).max())
    assert float(err.max()) > 0.25 * float(p.scales.float().min())  # the bound is not vacuous


def test_quantize_sym_stores_offset_codes_and_bounded_error():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(1)) * 0.02
    p = fmt.quantize_sym(w, 32)
    codes = fmt.unpack_codes(p.qweight)
    assert int(codes.min()) >= 1 and int(codes.max()) <= 15  # c in -7..7, stored as c + 8
    assert p.symmetric and p.mins is None  # version 2: no mins for a symmetric linear
    err = grouped((fmt.dequantize(p) - w).abs(), 32).amax(-1)
    assert bool((err <= 0.51 * p.scales.float() + 1e-6).all())


def test_quantizers_refuse_ragged_groups():
    with pytest.raises(fmt.FormatError, match="multiple of group size"):
        fmt.quantize_asym(torch.zeros(2, 48), 32)
    with pytest.raises(fmt.FormatError, match="multiple of group size"):
        fmt.quantize_sym(torch.zeros(2, 48), 32)


def test_reordering_on_a_device_never_reads_the_codes_on_the_host():
    """gpu_order and tile_tensors(back=True) run on a GPU's side stream after an expert's
    upload (layers/expert_cache.py): a host read of the codes (pack_codes's range check) would
    wait there for the upload, on the decode step's path. On the meta device any read raises."""
    q = torch.empty(32, 64, dtype=torch.uint8, device="meta")
    s = torch.empty(32, 4, dtype=torch.float16, device="meta")
    assert fmt.gpu_order(q, 32).shape == q.shape
    assert fmt.gpu_order(q, 32, back=True).shape == q.shape
    tiled = fmt.PackedInt4(q, s, s, 32, tiles=True)
    assert [t.shape for t in fmt.tile_tensors(tiled, back=True)] == [q.shape, s.shape,
                                                                              s.shape]
