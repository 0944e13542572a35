"""q8_gemv beyond equivalence: every SIMD level (printed), the -128 code the sign trick must
handle, a row's logits independent of the rows batched with it, and the Q8_0 head against
the fp32 head it replaces."""
import pytest
import torch

from engined import helper
from engined.layers.embedding import Q8TiedEmbedding, TiedEmbedding
from engined.ops.q8_gemv import cpu_c, reference
from tests.ops.helpers import random_q8
from tests.support.simd import amx, check_amx_bits, int8_level_or_skip, level_ids  # noqa: F401

LEVELS = helper.INT8_LEVELS


@pytest.fixture(params=sorted(LEVELS), ids=level_ids(LEVELS))
def level(request):
    """Each integer-dot kernel this CPU has (the others skip, naming the one that ran)."""
    try:
        ran = int8_level_or_skip(request.param)
        assert helper.q8_simd() == ran
        yield ran
    finally:
        helper.w4a8_simd(3)


def test_every_level_matches_the_reference(level):
    gen = torch.Generator().manual_seed(level)
    w = random_q8(gen, 333, 576)
    x = torch.randn(5, 576, generator=gen)
    want = reference.q8_gemv(x, w)
    got = cpu_c.q8_gemv(x, w)
    assert torch.allclose(got, want, atol=1e-6 * 576, rtol=1e-5)


def test_extreme_codes_are_exact(level):
    """Codes -128 and 127 against x codes +-127: |w| * sign(x, w) must not saturate."""
    q = torch.tensor([[-128] * 32, [127] * 32, [-128, 127] * 16], dtype=torch.int8)
    w = reference.PackedQ8(q, torch.ones(3, 1, dtype=torch.float16))
    x = torch.tensor([[1.0] * 32, [-1.0] * 32])             # d = 1/127, xq = +-127
    got = cpu_c.q8_gemv(x, w)
    assert torch.allclose(got, reference.q8_gemv(x, w), rtol=1e-6)
    assert torch.allclose(got, torch.tensor([[-4096.0, 4064.0, -16.0], [4096.0, -4064.0, 16.0]]),
                          rtol=1e-6)


def test_a_row_does_not_depend_on_its_batch(level):
    gen = torch.Generator().manual_seed(7)
    w = random_q8(gen, 500, 576)
    x = torch.randn(8, 576, generator=gen)
    batched = cpu_c.q8_gemv(x, w)
    for r in range(8):
        assert torch.equal(cpu_c.q8_gemv(x[r:r + 1], w)[0], batched[r])


def test_bad_shapes_are_refused():
    gen = torch.Generator().manual_seed(1)
    w = random_q8(gen, 10, 64)
    with pytest.raises(Exception, match="q8_gemv"):
        cpu_c.q8_gemv(torch.randn(1, 96), w)
    bad = reference.PackedQ8(w.q, w.scales.float())
    with pytest.raises(Exception, match="fp16 scales"):
        cpu_c.q8_gemv(torch.randn(1, 64), bad)


def test_q8_head_is_the_fp32_head_up_to_x_rounding():
    """The same Q8_0 weights as an fp32 matrix (TiedEmbedding) and kept as codes
    (Q8TiedEmbedding): lookups agree exactly; logits differ only by x's int8 rounding."""
    gen = torch.Generator().manual_seed(3)
    w = random_q8(gen, 2000, 576)
    exact = TiedEmbedding(w.dequantize().float())
    kept = Q8TiedEmbedding(w)
    tokens = torch.tensor([0, 5, 1999, 5])
    assert torch.equal(kept.embed(tokens), exact.embed(tokens))
    x = torch.randn(4, 576, generator=gen)
    got, want = kept.logits(x), exact.logits(x)
    assert (got - want).abs().max() <= 0.02 * want.abs().max()   # int8 x: ~1% per block
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75
    assert kept.nbytes == 2000 * 576 + 2000 * 18 * 2


@pytest.mark.parametrize("level", [2, 3], ids=level_ids(LEVELS)[2:], indirect=True)
def test_vnni_kernels_are_the_avx2_kernels_bits(level):
    """vpdpbusd on |w| and sign(x, w) gives the int32 dots that maddubs + madd give, so the
    head's logits are AVX2's bit for bit (tails of 1..7 blocks, the -128 code, batches)."""
    gen = torch.Generator().manual_seed(level)
    cases = [(random_q8(gen, 97, k), torch.randn(8, k, generator=gen)) for k in (576, 32, 224)]
    cases[0][0].q[:, :64] = -128
    helper.w4a8_simd(1)
    want = [cpu_c.q8_gemv(x[:rows], w) for w, x in cases for rows in (1, 3, 8)]
    assert helper.w4a8_simd(level) == level
    got = [cpu_c.q8_gemv(x[:rows], w) for w, x in cases for rows in (1, 3, 8)]
    for y, ref in zip(got, want):
        assert torch.equal(y, ref)


def extreme_tiles(seed: int, n: int, k: int):
    """A random Q8_0 head (w), the same in tiles, and x [70, k]: codes -128 in rows 0-7 and
    127 in rows 8-15 of w, and x's row 0 all ones, so that its codes are all 127."""
    gen = torch.Generator().manual_seed(seed)
    w = random_q8(gen, n, k)
    w.q[:8] = -128
    w.q[8:16] = 127
    x = torch.randn(70, k, generator=gen) * 2
    x[0] = 1.0
    return w, w.in_tiles(), x


def test_the_tiles_give_the_same_bits_at_every_level_and_batch(level):
    """q8_tiles: AVX-512 VNNI (w ^ 0x80 from -128 * sum(x)) and AVX2 (|w|, sign) against the
    portable C text bitwise, for a row alone and in batches of 2..70; codes -128 and 127."""
    ran = helper.tiles_simd()
    if ran != level:
        pytest.skip(f"no {LEVELS[level]} tile kernel: {LEVELS[ran]} ran")
    w, tiled, x = extreme_tiles(9, 96, 576)
    got = cpu_c.q8_tiles(x, tiled)
    assert torch.allclose(got, reference.q8_gemv(x, w), atol=1e-6 * 576, rtol=1e-5)
    for rows in (*range(1, 10), 17, 66):  # AVX-512: 1..8 rows a block, then blocks of 4
        assert torch.equal(cpu_c.q8_tiles(x[:rows], tiled), got[:rows]), rows
    helper.w4a8_simd(0)
    assert torch.equal(cpu_c.q8_tiles(x, tiled), got)


def test_amx_gives_the_head_the_bits_of_vnni_and_portable_c(amx):
    """Intel AMX for the head (6+ rows a call, TDPBSSD on the tiles' codes in place) against
    the AVX-512 VNNI kernel and the portable C text: rows around the switch and the 16-row tile,
    k = 608 (19 blocks: two at a time, one left over), codes -128 and 127 against x = 127."""
    _, tiled, x = extreme_tiles(10, 112, 608)
    check_amx_bits(lambda xs: cpu_c.q8_tiles(xs, tiled), x, (5, 6, 7, 16, 17, 33, 70), 6)


def test_the_tiles_layout_and_the_lookup():
    """Row i is lane i % 16 of tile i // 16: the lookup reads it back, and so does untiled."""
    w = random_q8(torch.Generator().manual_seed(10), 48, 64)
    tiled = w.in_tiles()
    assert torch.equal(tiled.q.view(3, 16, 16, 4)[2, 3, 5], w.q[37, 12:16])
    assert torch.equal(tiled.scales.view(3, 2, 16)[1, 1], w.scales[16:32, 1])
    rows = torch.tensor([0, 17, 47, 17])
    assert torch.equal(tiled.dequantize(rows), w.dequantize(rows))
    assert torch.equal(tiled.untiled().q, w.q) and torch.equal(tiled.untiled().scales, w.scales)
    with pytest.raises(Exception, match="q8_gemv: W is in the CPU's tiles"):
        cpu_c.q8_gemv(torch.randn(1, 64), tiled)


def test_the_head_goes_into_tiles_in_place_and_back():
    w = random_q8(torch.Generator().manual_seed(11), 64, 96)
    head, before = Q8TiedEmbedding(w), w.q.clone()
    x = torch.randn(3, 96)
    want = head.logits(x)
    head.to_tiles_()
    assert head.packed.tiles and head.packed.q.data_ptr() == w.q.data_ptr()
    assert torch.allclose(head.logits(x), want, atol=1e-6 * 96, rtol=1e-5)
    assert torch.equal(head.embed(torch.tensor([5, 60])), Q8TiedEmbedding(
        reference.PackedQ8(before, head.packed.untiled().scales)).embed(torch.tensor([5, 60])))
    head.to_tiles_(back=True)
    assert not head.packed.tiles and torch.equal(w.q, before)


def test_the_head_tiles_in_place_a_block_at_a_time():
    w = random_q8(torch.Generator().manual_seed(12), 80, 64)
    whole = w.in_tiles()
    copy = reference.PackedQ8(w.q.clone(), w.scales.clone())
    copy.tile_in_place_(block_rows=32)
    assert torch.equal(copy.q, whole.q) and torch.equal(copy.scales, whole.scales)
    reference.PackedQ8(copy.q, copy.scales, tiles=True).tile_in_place_(back=True, block_rows=48)
    assert torch.equal(copy.q, w.q) and torch.equal(copy.scales, w.scales)



def test_the_c_lookup_is_the_dequantized_rows_in_either_layout():
    """helper.q8_embed (the embedding's CPU path) against PackedQ8.dequantize, bit for bit:
    code * scale is exact in fp32. An id outside the table is refused with the ids."""
    w = random_q8(torch.Generator().manual_seed(13), 48, 96)
    ids = torch.tensor([0, 47, 16, 16, 31])
    want = w.dequantize(ids, torch.float32)
    assert torch.equal(helper.q8_embed(w.q, w.scales, False, ids), want)
    tiled = w.in_tiles()
    assert torch.equal(helper.q8_embed(tiled.q, tiled.scales, True, ids), want)
    assert torch.equal(Q8TiedEmbedding(tiled).embed(ids), want)
    with pytest.raises(ValueError, match=r"outside 0\.\.47 in \[3, 48\]"):
        helper.q8_embed(w.q, w.scales, False, torch.tensor([3, 48]))


def test_the_c_lookup_refuses_what_it_cannot_read_and_takes_no_ids():
    w = random_q8(torch.Generator().manual_seed(14), 32, 64)
    assert helper.q8_embed(w.q, w.scales, False, torch.tensor([], dtype=torch.int64)).shape == (0, 64)
    with pytest.raises(ValueError, match=r"fp16 \[V, D/32\].*\[32, 1\]"):
        helper.q8_embed(w.q, w.scales[:, :1].contiguous(), False, torch.tensor([1]))
    with pytest.raises(ValueError, match=r"token ids \[T\]"):
        helper.q8_embed(w.q, w.scales, False, torch.tensor([[1, 2]]))
