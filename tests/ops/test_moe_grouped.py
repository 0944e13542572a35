"""moe_grouped specifics beyond equivalence: a batched row equals the row alone (bit for
bit, at every SIMD level the CPU has), thread counts change nothing, bad routes are named."""
import pytest
import torch

from engined import helper
from engined.ops import registry
from tests.ops.helpers import experts, same_bits_on_1_and_2_threads

E, D, INNER, K = 16, 256, 96, 4
LEVELS = {level: name for level, name in helper.SIMD_LEVELS.items()}


@pytest.fixture(scope="module")
def banks():
    gen = torch.Generator().manual_seed(4)
    w1, w3 = (experts(gen, E, INNER, D, 32, symmetric=True) for _ in range(2))
    return w1, w3, experts(gen, E, D, INNER, 32, symmetric=True)


def batch(seed: int, tokens: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(tokens)])
    ids[1:3, 0] = ids[0, 0]                       # some experts shared across rows
    return torch.randn(tokens, D, generator=gen), ids, torch.rand(tokens, K, generator=gen)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_a_batched_row_equals_the_row_alone_at_every_kernel_level(banks, level):
    fn = registry.variants("moe_grouped")["cpu_c"].fn
    x, ids, weights = batch(level, 8)
    try:
        used = helper.gemv_simd(level)
        if used != level:
            pytest.skip(f"this CPU has no {LEVELS[level]} kernel (runs {LEVELS[used]})")
        print(f"moe_grouped cpu_c at SIMD level {used} ({LEVELS[used]})")
        together = fn(x, *banks, ids, weights)
        alone = torch.cat([fn(x[t:t + 1], *banks, ids[t:t + 1], weights[t:t + 1]) for t in range(8)])
    finally:
        helper.gemv_simd(2)
    assert torch.equal(together, alone)
    want = registry.variants("moe_grouped")["reference"].fn(x, *banks, ids, weights)
    torch.testing.assert_close(together, want, atol=1e-3, rtol=1e-4)


def test_the_one_token_path_it_replaces_gives_the_same_bits(banks):
    """Decode rows moved from moe_swiglu + w4a16_grouped_gemv (one token) to moe_grouped."""
    w1, w3, w2 = banks
    x, ids, weights = batch(7, 3)
    got = registry.variants("moe_grouped")["cpu_c"].fn(x, *banks, ids, weights)
    swiglu, down = (registry.variants(op)["cpu_c"].fn for op in ("moe_swiglu", "w4a16_grouped_gemv"))
    for t in range(3):
        y = down(swiglu(x[t:t + 1], w1, w3, ids[t]), w2, ids[t])        # [k, D]
        summed = torch.zeros(D)
        for c in range(K):                                   # in choice order, each op rounded
            summed = summed + weights[t, c] * y[c]
        assert torch.equal(got[t], summed)


def test_thread_count_does_not_change_a_single_bit(banks):
    fn = registry.variants("moe_grouped")["cpu_c"].fn
    x, ids, weights = batch(5, 32)                 # enough work to wake the pool
    same_bits_on_1_and_2_threads(fn, x, *banks, ids, weights)


@pytest.mark.parametrize("variant", ["reference", "cpu_c"])
def test_bad_routes_and_shapes_are_named(banks, variant):
    fn = registry.variants("moe_grouped")[variant].fn
    x, ids, weights = batch(6, 2)
    with pytest.raises(ValueError, match=rf"expert ids must lie in 0\.\.{E - 1}, got 0\.\.{E}"):
        fn(x, *banks, torch.tensor([[0, 1, 2, E], [0, 1, 2, 3]]), weights)
    with pytest.raises(ValueError, match=r"must both be \[2, k\]"):
        fn(x, *banks, ids[:, :2], weights)
    with pytest.raises(ValueError, match=rf"x must be \[T, {D}\]"):
        fn(x[:, :-1], *banks, ids, weights)
    w1, w3, w2 = banks
    with pytest.raises(ValueError, match=r"w2 \[E, D, I\]"):
        fn(x, w1, w3, w1, ids, weights)
