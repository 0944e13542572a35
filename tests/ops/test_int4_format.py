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


def example() -> fmt.PackedInt4:
    return fmt.PackedInt4(torch.tensor([EXAMPLE_BYTES], dtype=torch.uint8),
                          torch.tensor([EXAMPLE_SCALES], dtype=torch.float16),
                          torch.tensor([EXAMPLE_MINS], dtype=torch.float16), 4)


def random_packed(n: int, k: int, g: int, seed: int = 0) -> fmt.PackedInt4:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    scales = (torch.rand(n, k // g, generator=gen) * 0.1).half()
    mins = (torch.randn(n, k // g, generator=gen) * 0.1).half()
    return fmt.PackedInt4(fmt.pack_codes(codes), scales, mins, g)


def test_worked_example_bytes_and_weights():
    packed = fmt.pack_codes(torch.tensor([EXAMPLE_CODES]))
    assert packed.tolist() == [EXAMPLE_BYTES]
    assert fmt.unpack_codes(packed).tolist() == [EXAMPLE_CODES]
    assert fmt.dequantize(example()).tolist() == [EXAMPLE_WEIGHTS]


def test_c_helper_matches_worked_example():
    p = example()
    out = helper.unpack_int4(p.qweight.numpy(), p.scales.numpy(), p.mins.numpy(), p.group_size)
    assert out.tolist() == [EXAMPLE_WEIGHTS]


@pytest.mark.parametrize("n,k,g", [(1, 2, 2), (3, 64, 32), (5, 128, 64), (7, 96, 32), (4, 576, 32)])
def test_c_helper_is_bit_identical_to_reference(n, k, g):
    p = random_packed(n, k, g, seed=n * k + g)
    out = helper.unpack_int4(p.qweight.numpy(), p.scales.numpy(), p.mins.numpy(), g)
    assert np.array_equal(out, fmt.dequantize(p).numpy())


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
    meta = fmt.metadata({"blk.0.attn_q": 32})
    fmt.check_metadata(meta)
    state = fmt.to_state_dict("blk.0.attn_q", random_packed(2, 64, 32))
    assert fmt.from_state_dict("blk.0.attn_q", state, meta).group_size == 32
    with pytest.raises(fmt.FormatError, match="not a kimi-packed-int4 artifact"):
        fmt.check_metadata(None)
    with pytest.raises(fmt.FormatError, match="not a kimi-packed-int4 artifact"):
        fmt.check_metadata({**meta, fmt.FORMAT_KEY: "gptq"})
    with pytest.raises(fmt.FormatError, match="version '2' is not supported"):
        fmt.check_metadata({**meta, fmt.VERSION_KEY: "2"})
    with pytest.raises(fmt.FormatError, match="group size missing"):
        fmt.from_state_dict("blk.0.attn_q", state, fmt.metadata({}))


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
    assert torch.equal(p.mins, (-8 * p.scales.float()).half())
    err = grouped((fmt.dequantize(p) - w).abs(), 32).amax(-1)
    assert bool((err <= 0.51 * p.scales.float() + 1e-6).all())


def test_quantizers_refuse_ragged_groups():
    with pytest.raises(fmt.FormatError, match="multiple of group size"):
        fmt.quantize_asym(torch.zeros(2, 48), 32)
    with pytest.raises(fmt.FormatError, match="multiple of group size"):
        fmt.quantize_sym(torch.zeros(2, 48), 32)
