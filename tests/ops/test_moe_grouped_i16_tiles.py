"""moe_grouped (W4A16) on expert stacks in the CPU's tiles (csrc/kimi_tiles_i16.c): x and h
rounded to int16 per block of 32 as the row layout's int16 dots round them, each code split
into its two bytes for vpdpbusd. Checked against the plain float64 reference that rounds the
same way (moe_grouped_w4a8's at 16 bits) and, by the rounding's bound, against the unrounded
one; for one set of bits at every integer-dot level (AVX-512 VNNI, AVX2 and the portable C,
whose scalar rounding the AVX2 rounding must match), alone or batched, on 1 or 2 threads;
and for the blocks a rounding can get wrong: a NaN, zeros, ties, 1e12 beside 1e-12."""
import pytest
import torch

from engined import helper
from engined.ops import registry
from tests.ops.helpers import (banks_and_tiles, distances, experts, same_bits_on_1_and_2_threads,
                              shared_routes)
from tests.support.simd import int8_levels

E, K = 16, 4

level = int8_levels()
fn = registry.variants("moe_grouped")["cpu_c"].fn


@pytest.fixture(scope="module", params=[(256, 128, 32, False), (96, 160, 32, True),
                                        (128, 192, 64, False)],
                ids=["asymmetric", "symmetric-k96", "group64"])
def banks(request):
    d, inner, group, symmetric = request.param
    return banks_and_tiles(d + group, E, d, inner, group, symmetric)


def batch(seed: int, tokens: int, d: int):
    x, ids, weights = shared_routes(seed, tokens, d, E, K)
    x[0, :32] *= 1e3                        # blocks of very different sizes in one row
    x[-1, 32:64] *= 1e-3
    return x, ids, weights


def at_portable_c(call):
    """call() with the integer-dot kernels capped at C (tiles_c's scalar rounding too)."""
    helper.w4a8_simd(0)
    try:
        return call()
    finally:
        helper.w4a8_simd(3)


@pytest.mark.parametrize("tokens", [1, 3, 11])
def test_tiles_give_the_int16_references_numbers_and_one_set_of_bits(banks, level, tokens):
    rows, tiles = banks
    x, ids, weights = batch(level + tokens, tokens, rows[2].shape[1])
    together = fn(x, *tiles, ids, weights)
    alone = torch.cat([fn(x[t:t + 1], *tiles, ids[t:t + 1], weights[t:t + 1])
                       for t in range(tokens)])
    assert torch.equal(together, alone)     # 11 rows of one segment: calls of 4, 4 and 3
    assert torch.equal(at_portable_c(lambda: fn(x, *tiles, ids, weights)), together)
    to_rounded, to_plain, plain = distances(together, x, rows, ids, weights)
    # test_moe_grouped_int16.py's bounds for the row layout's int16 dots (the same rounding):
    # fp32 sums against float64 ones, now and then an h value a rounding step away; a wrong
    # byte, lane or scale is off by the order of the values themselves
    assert to_rounded < 1.5e-5 and 3 * to_rounded < to_plain, (to_rounded, to_plain)
    assert ((together - plain).abs() / plain.abs().amax(-1, keepdim=True)).max() < 5e-4


def test_thread_count_does_not_change_a_single_bit(banks):
    _, tiles = banks
    x, ids, weights = batch(5, 12, tiles[2].shape[1])
    same_bits_on_1_and_2_threads(fn, x, *tiles, ids, weights)


def test_blocks_that_a_rounding_gets_wrong_give_the_portable_bits(banks, level):
    """The SIMD rounding (AVX2, where the tile kernels run SIMD) against kh_round_block's
    scalar one through the whole layer: exact ties at 16 bits, a zero block, 1e12 beside
    1e-12, subnormals; a NaN or an inf makes its own token NaN and no other."""
    rows, tiles = banks
    d = rows[2].shape[1]
    x, ids, weights = batch(7, 6, d)
    x[0, :32] = torch.arange(-16, 16) + 0.5
    x[0, 0] = 32767.0                                       # d = 1: every x.5 is a tie
    x[0, 1:8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 32766.5])
    x[1, :32] = 0.0
    x[2, :32] = torch.tensor([1e12, 1e-12] * 16)
    x[3, 32:64] = 1e-42                                     # subnormal
    x[4, 64:96] = float("nan")
    x[5, 40] = float("inf")                                 # d = inf, 1/d = 0: inf * 0 = NaN
    got = fn(x, *tiles, ids, weights)
    portable = at_portable_c(lambda: fn(x, *tiles, ids, weights))
    torch.testing.assert_close(got, portable, atol=0, rtol=0, equal_nan=True)
    assert got[4:].isnan().all() and not got[:4].isnan().any()


def test_w4a16_tiles_refuse_groups_that_are_not_whole_blocks():
    gen = torch.Generator().manual_seed(1)
    rows = [experts(gen, E, 32, 64, 16) for _ in range(2)] + [experts(gen, E, 64, 32, 16)]
    tiles = [b.to_tiles() for b in rows] if all(b.group_size % 32 == 0 for b in rows) else None
    assert tiles is None                    # to_tiles refuses them first (int4_format.can_tile)
    x, ids, weights = batch(1, 1, 64)
    assert fn(x, *rows, ids, weights).shape == (1, 64)   # rows still run groups of 16
