"""moe_grouped's W4A16 integer dots (csrc/kimi_moe_i16.c; AVX-512 VNNI and AVX2 kernels): x and
h rounded to int16 per block of 32, at each integer-dot level the CPU has. Checked against a plain float64 reference that rounds the same way
(moe_grouped_w4a8's, at 16 bits), against the unrounded reference by the rounding's bound, and
for the batch invariance the float kernels have: a token's result is the same bits alone, in
a segment of up to 8 rows, or on 1 or 2 threads. Skips, and says so, where they do not run."""
import pytest
import torch

from engined import helper
from engined.ops import registry
from tests.ops.helpers import distances, experts, same_bits_on_1_and_2_threads

E, D, INNER, K = 16, 256, 128, 4        # D and INNER multiples of 64: the int16 dots' shapes


def bank(seed: int, group: int, symmetric: bool, d: int = D, inner: int = INNER):
    gen = torch.Generator().manual_seed(seed)
    w1, w3 = (experts(gen, E, inner, d, group, symmetric) for _ in range(2))
    return w1, w3, experts(gen, E, d, inner, group, symmetric)


LEVELS = {3: "AVX-512 VNNI", 1: "AVX2"}   # the two kernel sets (w4a8_simd's levels)


@pytest.fixture(params=sorted(LEVELS, reverse=True), ids=LEVELS.get)
def level(request):
    """Runs the test with the integer-dot kernels at this level (AVX2: every kernel capped
    at AVX2, as on an AVX2-only CPU); skips where the CPU lacks it, naming what runs."""
    try:
        used = helper.w4a8_simd(request.param) if request.param == 3 else (
            helper.gemv_simd(1), helper.w4a8_simd())[1]
        if used != request.param:
            pytest.skip(f"this CPU has no {LEVELS[request.param]} integer dots (it runs "
                        f"{helper.INT8_LEVELS[used]})")
        print(f"moe_grouped's int16 dots at {LEVELS[used]}")
        yield used
    finally:
        helper.gemv_simd(2)
        helper.w4a8_simd(3)


def int16_dots(group: int = 32, d: int = D, inner: int = INNER):
    assert helper.moe_int16(d, inner, group), "the int16 dots should run at this level"


def batch(seed: int, tokens: int, same_experts: bool = False, d: int = D):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(tokens)])
    if same_experts:
        ids[:] = ids[0]                     # one segment of `tokens` rows per expert
    x = torch.randn(tokens, d, generator=gen)
    x[0, :32] *= 1e3                        # blocks of very different sizes in one row
    x[1, 32:64] *= 1e-3
    return x, ids, torch.rand(tokens, K, generator=gen)


fn = registry.variants("moe_grouped")["cpu_c"].fn


# D, INNER, group, symmetric: rows of 8, 20, 24 blocks in steps of 8 (the last step 2, 4, 6 or
# 8 blocks), one scale per 1, 2 or 4 blocks, with and without mins
SHAPES = [(256, 128, 32, True), (640, 576, 32, True), (640, 448, 32, False),
          (640, 448, 64, False), (768, 384, 128, True)]


@pytest.mark.parametrize("d,inner,group,symmetric", SHAPES)
def test_the_dots_are_exactly_x_and_h_rounded_to_int16(level, d, inner, group, symmetric):
    int16_dots(group, d, inner)
    banks = bank(group + symmetric, group, symmetric, d, inner)
    x, ids, weights = batch(1, 6, d=d)
    got = fn(x, *banks, ids, weights)
    to_rounded, to_plain, plain = distances(got, x, banks, ids, weights)
    # fp32 sums against float64 ones, and now and then an h value on the other side of a
    # rounding step (its fp32 sum is not the reference's; measured 2e-7 to 7.5e-6 over 3 seeds
    # of each shape): far nearer the rounded reference. A wrong layout, lane or scale is off
    # by the order of the values themselves.
    assert to_rounded < 1.5e-5 and 3 * to_rounded < to_plain, (to_rounded, to_plain)
    # the rounding's cost: 2^-16 of a block's largest value per input, far under bfloat16's
    # 2^-9 of each value, and not nothing (the float kernels sit near 4e-7 here)
    assert 1e-5 < to_plain < 3e-4, to_plain
    assert ((got - plain).abs() / plain.abs().amax(-1, keepdim=True)).max() < 5e-4


@pytest.mark.parametrize("tokens", [2, 5, 8])
def test_a_segment_of_rows_gives_each_row_its_bits_alone(level, tokens):
    int16_dots()
    banks = bank(7, 32, True)
    x, ids, weights = batch(tokens, tokens, same_experts=True)
    together = fn(x, *banks, ids, weights)
    alone = torch.cat([fn(x[t:t + 1], *banks, ids[t:t + 1], weights[t:t + 1])
                       for t in range(tokens)])
    assert torch.equal(together, alone)



def test_thread_count_does_not_change_a_single_bit(level):
    int16_dots()
    banks = bank(8, 32, True)
    x, ids, weights = batch(9, 32)
    same_bits_on_1_and_2_threads(fn, x, *banks, ids, weights)


def test_the_integer_cap_turns_them_off_and_shapes_outside_them_stay_float(level):
    int16_dots()
    banks = bank(10, 32, True)
    x, ids, weights = batch(3, 4)
    int16 = fn(x, *banks, ids, weights)
    helper.w4a8_simd(0)                     # portable C: the float kernels
    assert not helper.moe_int16(D, INNER, 32)
    float_dots = fn(x, *banks, ids, weights)
    assert not torch.equal(int16, float_dots)
    assert ((int16 - float_dots).abs() / float_dots.abs().amax(-1, keepdim=True)).max() < 5e-4
    if helper.gemv_simd() == 2:             # AVX-512 without VNNI: its float kernels, not AVX2's int16
        helper.w4a8_simd(1)
        assert not helper.moe_int16(D, INNER, 32)
    helper.w4a8_simd(level)
    assert not helper.moe_int16(D, 96, 32) and not helper.moe_int16(D + 32, INNER, 32)
    assert not helper.moe_int16(D, INNER, 16) and not helper.moe_int16(D, INNER, 0)
    assert helper.lib.moe_grouped_work_floats(4, D, INNER, 0) == -1     # no division by 0


def test_a_nan_in_a_token_shows_in_its_output_not_in_the_others(level):
    int16_dots()
    banks = bank(12, 32, True)
    x, ids, weights = batch(4, 3)
    x[1, 40] = float("nan")
    got = fn(x, *banks, ids, weights)
    assert got[1].isnan().all() and not got[[0, 2]].isnan().any()
