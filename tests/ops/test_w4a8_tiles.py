"""w4a8_tiles beyond equivalence: the layout byte for byte, the same bits from every kernel
level, every batch and thread count (a verify row is a decode row), and a model's linears in
tiles and back in place."""
from dataclasses import replace

import pytest
import torch

from engined import helper
from engined.layers.linear import Linear
from engined.ops import int4_format, registry
from engined.ops.int4_format import PackedInt4
from engined.ops.w4a16_gemv import cpu_c as w4a16_cpu_c
from engined.ops.w4a8_tiles import cpu_c
from tests.ops.helpers import random_int4
from tests.support.simd import amx, check_amx_bits, int8_levels  # noqa: F401 (amx: a fixture)

level = int8_levels()


def packed(n: int, k: int, group: int = 32, symmetric: bool = False, seed: int = 0) -> PackedInt4:
    return PackedInt4(group_size=group, **random_int4(torch.Generator().manual_seed(seed), n, k,
                                                      group, symmetric=symmetric))


def level_and_portable(x, w, counts) -> tuple[list, list]:
    """w4a8_tiles of x[:rows] for each count: by the level's own kernel (AMX off), then by
    the portable C (the cap left at 0: the level fixture restores it)."""
    helper.tiles_amx(False)
    try:
        got = [cpu_c.w4a8_tiles(x[:rows], w) for rows in counts]
    finally:
        helper.tiles_amx(True)
    helper.w4a8_simd(0)
    return got, [cpu_c.w4a8_tiles(x[:rows], w) for rows in counts]


@pytest.fixture
def threads():
    yield
    w4a16_cpu_c.set_num_threads(None)


def test_the_layout_is_the_documented_one():
    """Byte i of row j, chunk c, tile t: codes of inputs 8c + i (low) and 8c + 4 + i (high);
    scales [tile, group, row]; and back again, every tensor equal."""
    w = packed(48, 192, 64)
    t = int4_format.to_tiles(w)
    codes = int4_format.unpack_codes(w.qweight)                       # [48, 192]
    tq = t.qweight.reshape(3, 24, 16, 4)
    for tile, c, j, i in ((0, 0, 0, 0), (1, 5, 7, 2), (2, 23, 15, 3)):
        row = 16 * tile + j
        assert int(tq[tile, c, j, i]) == int(codes[row, 8 * c + i]) | int(codes[row, 8 * c + 4 + i]) << 4
    assert torch.equal(t.scales.reshape(3, 3, 16).transpose(1, 2).reshape(48, 3), w.scales)
    assert torch.equal(t.mins.reshape(3, 3, 16).transpose(1, 2).reshape(48, 3), w.mins)
    back = int4_format.from_tiles(t)
    assert not back.tiles and torch.equal(back.qweight, w.qweight)
    assert torch.equal(int4_format.dequantize(t), int4_format.dequantize(w))


def test_shapes_that_do_not_tile_are_refused():
    with pytest.raises(int4_format.FormatError, match="does not go into tiles"):
        int4_format.to_tiles(packed(40, 96))                          # N % 16
    with pytest.raises(int4_format.FormatError, match="does not go into tiles"):
        int4_format.to_tiles(packed(32, 96, group=16))                # not W4A8's blocks
    with pytest.raises(registry.KernelError, match="not in tiles"):
        cpu_c.w4a8_tiles(torch.randn(1, 96), packed(32, 96))
    with pytest.raises(int4_format.FormatError, match="never written"):
        int4_format.to_state_dict("w", int4_format.to_tiles(packed(32, 96)))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", [32, 64])
def test_every_kernel_level_gives_the_portable_bits(level, group, symmetric):
    """AVX-512 VNNI and AVX2 tile kernels against the portable C text, for rows 1..9 (AVX-512
    VNNI takes up to 8 as one block) and 70; AMX off, so that the level's own kernel runs."""
    ran = helper.tiles_simd()
    if ran != level:
        pytest.skip(f"no {helper.INT8_LEVELS[level]} tile kernel: {helper.INT8_LEVELS[ran]} ran")
    w = int4_format.to_tiles(packed(112, 576, group, symmetric, seed=group))
    x = torch.randn(70, 576, generator=torch.Generator().manual_seed(1)) * 3
    counts = (*range(1, 10), 70)
    got, portable = level_and_portable(x, w, counts)
    assert helper.tiles_simd() == 0
    for rows, fast, plain in zip(counts, got, portable):
        assert torch.equal(fast, plain), rows


def test_a_row_is_the_same_bits_in_any_batch():
    """Decode (1 row), verify steps (2..9 rows) and prefill (70 rows): row r of each equals
    row r alone, so speculation and a warm prefix cache cannot change a greedy token."""
    w = int4_format.to_tiles(packed(96, 320, 64, seed=2))
    x = torch.randn(70, 320, generator=torch.Generator().manual_seed(3))
    alone = torch.cat([cpu_c.w4a8_tiles(x[r:r + 1], w) for r in range(70)])
    for rows in (2, 3, 5, 8, 9, 70):
        assert torch.equal(cpu_c.w4a8_tiles(x[:rows], w), alone[:rows]), rows


@pytest.mark.parametrize("rows", [1, 6, 200])
def test_thread_count_does_not_change_a_single_bit(threads, rows):
    w = int4_format.to_tiles(packed(1024, 1024, seed=4))              # wakes the pool
    x = torch.randn(rows, 1024, generator=torch.Generator().manual_seed(5))
    w4a16_cpu_c.set_num_threads(1)
    one = cpu_c.w4a8_tiles(x, w)
    for count in (2, 3):
        w4a16_cpu_c.set_num_threads(count)
        assert torch.equal(cpu_c.w4a8_tiles(x, w), one)


def test_a_linear_goes_into_tiles_in_place_and_back():
    """The same tensors (no second copy of W); decode rows and a prefill chunk both run the
    tile kernel; rows of whole tiles stay views; back, the disk's bytes return."""
    w = packed(64, 96, symmetric=True, seed=6)
    original = w.qweight.clone()
    lin = Linear.from_packed(w)
    storage = lin.qweight.data_ptr()
    lin.to_tiles_()
    assert lin.packed.tiles and lin.qweight.data_ptr() == storage
    x = torch.randn(20, 96, generator=torch.Generator().manual_seed(7))
    want = registry.variants("w4a8_tiles")[registry.REFERENCE].fn(x, lin.packed)
    torch.testing.assert_close(lin(x), want, atol=96e-6, rtol=1e-5)   # 20 rows: prefill
    assert torch.equal(lin(x[:3]), lin(x)[:3])                        # decode rows: same bits
    part = lin.rows(16, 48)
    assert part.packed.tiles and torch.equal(part(x), lin(x)[:, 16:48])
    with pytest.raises(ValueError, match="not whole tiles"):
        lin.rows(8, 48)
    with pytest.raises(ValueError, match="does not go into the GPU order"):
        lin.to_gpu_order_()
    lin.to_tiles_(back=True)
    assert not lin.packed.tiles and torch.equal(lin.qweight, original)


@pytest.mark.parametrize("k", [96, 32])
@pytest.mark.parametrize("symmetric", [False, True])
def test_tiling_in_place_a_block_at_a_time_is_tiling_whole(symmetric, k):
    """Blocks of 16 and 48 rows give the bytes of one whole pass, and back (a block's tiles
    are that block's bytes: no transient copy of all of W). k = 32: one group a row, whose
    regrouped scales are the block itself (the copy back used to fail on the overlap)."""
    w = packed(80, k, symmetric=symmetric, seed=12)
    whole = int4_format.to_tiles(w)
    for block_rows in (16, 48):
        copy = PackedInt4(w.qweight.clone(), w.scales.clone(),
                          None if symmetric else w.mins.clone(), 32)
        int4_format.tile_blocks_(copy, block_rows=block_rows)
        assert torch.equal(copy.qweight, whole.qweight) and torch.equal(copy.scales, whole.scales)
        assert symmetric or torch.equal(copy.mins, whole.mins)
        int4_format.tile_blocks_(replace(copy, tiles=True), back=True, block_rows=block_rows)
        assert torch.equal(copy.qweight, w.qweight) and torch.equal(copy.scales, w.scales)


@pytest.mark.parametrize("n,k,group,symmetric", [(80, 96, 32, False), (48, 32, 32, True),
                                                 (32, 384, 96, False), (64, 256, 128, True),
                                                 (16, 64, 16, False), (16, 32, 2, True)])
def test_the_c_tiler_gives_the_references_bytes_both_ways(n, k, group, symmetric):
    """helper.tile_int4 (what tile_in_place_ runs where the helper is built) against
    tile_tensors, the layout's definition: a stack of 3 experts as one linear of 3n rows, on 1
    and 3 threads, into tiles and back; k = 32 is one group a row, groups of 2 have more scale
    bytes than code bytes (the copy buffer holds either); refusals for what does not tile."""
    gen = torch.Generator().manual_seed(n + k)
    lead = random_int4(gen, 3 * n, k, group, symmetric=symmetric)
    w = PackedInt4(group_size=group, **lead)
    want = int4_format.tile_tensors(w)
    for threads in (1, 3):
        q, s, m = (None if t is None else t.clone().view(3, n, -1)
                   for t in (w.qweight, w.scales, w.mins))
        helper.tile_int4(q, s, m, group, threads=threads)
        for got, ref in zip((q, s, m), want):
            assert (got is None and ref is None) or torch.equal(got.view(ref.shape), ref)
        helper.tile_int4(q, s, m, group, back=True, threads=threads)
        for got, ref in zip((q, s, m), (w.qweight, w.scales, w.mins)):
            assert (got is None and ref is None) or torch.equal(got.view(ref.shape), ref)
    bad = packed(24, 64)                               # 24 rows: not whole tiles
    with pytest.raises(helper.HelperError):
        helper.tile_int4(bad.qweight, bad.scales, bad.mins, 32)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", [32, 96])
def test_amx_gives_the_bits_of_vnni_and_portable_c(amx, group, symmetric):
    """Intel AMX (7+ rows a call, 16 at most) against the AVX-512 VNNI kernel and the portable
    C text: row counts around the 7-row switch and the 16-row tile; k = 672 is 21 blocks (two
    at a time: one left over), and groups of 96 (3 blocks) split across the pairs."""
    w = int4_format.to_tiles(packed(112, 672, group, symmetric, seed=group + symmetric))
    x = torch.randn(70, 672, generator=torch.Generator().manual_seed(8)) * 3
    check_amx_bits(lambda xs: cpu_c.w4a8_tiles(xs, w), x, (6, 7, 9, 16, 17, 33, 70), 7)
    assert helper.tiles_kernels() == "AVX-512 VNNI, AMX from 7 rows (the head from 6)"


def test_an_inf_in_x_quantizes_as_the_portable_c_does(level):
    """A block holding an inf has d = inf and 1/d = 0, so its inf becomes inf * 0 = NaN before
    rounding: the portable C writes code 0 there, and the SIMD quantizers wrote -127 (NaN
    through cvtt is INT_MIN, then the clamp). Every level now gives the portable bits: one
    row (x in natural order) and 2..9 and 70 (interleaved at AVX-512)."""
    x = torch.randn(70, 576, generator=torch.Generator().manual_seed(6))
    x[::3, 40] = float("inf")
    x[1::3, 100] = -float("inf")
    tiled = int4_format.to_tiles(packed(112, 576, seed=8))
    counts = (*range(1, 10), 70)
    got, portable = level_and_portable(x, tiled, counts)
    for rows, fast, plain in zip(counts, got, portable):
        torch.testing.assert_close(fast, plain, rtol=0, atol=0, equal_nan=True, msg=f"{rows} rows")
