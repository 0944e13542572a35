"""moe_grouped_w4a8 beyond equivalence: every integer-dot level (printed; the SIMD ones the
same bits), a token's result the same bits alone or batched and at any thread count, the
dense W4A8 GEMV's numbers at one token, and clear refusals."""
import pytest
import torch
import torch.nn.functional as F

from engined import helper
from engined.ops import registry
from engined.ops.w4a16_gemv import cpu_c as w4a16_cpu_c
from engined.ops.w4a8_gemv import cpu_c as w4a8_cpu_c
from tests.ops.helpers import experts
from tests.support.simd import int8_levels

E, K = 16, 4


level = int8_levels()


def fn():
    return registry.variants("moe_grouped_w4a8")["cpu_c"].fn


@pytest.fixture(scope="module", params=[(256, 128, False), (96, 160, True)],
                ids=["paired", "unpaired-symmetric"])
def banks(request):
    """D x I: 256 x 128 (every k % 64 == 0: the 4-row and batched kernels) and 96 x 160 (the
    per-row kernel for both phases), symmetric."""
    d, inner, symmetric = request.param
    gen = torch.Generator().manual_seed(d)
    w1, w3 = (experts(gen, E, inner, d, 32, symmetric) for _ in range(2))
    return w1, w3, experts(gen, E, d, inner, 32, symmetric)


def batch(seed: int, tokens: int, d: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(tokens)])
    ids[1:3, 0] = ids[0, 0]                       # some experts shared across rows
    return torch.randn(tokens, d, generator=gen), ids, torch.rand(tokens, K, generator=gen)


def test_a_batched_row_equals_the_row_alone_at_every_level(banks, level):
    x, ids, weights = batch(level, 8, banks[2].shape[1])
    together = fn()(x, *banks, ids, weights)
    alone = torch.cat([fn()(x[t:t + 1], *banks, ids[t:t + 1], weights[t:t + 1])
                       for t in range(8)])
    helper.w4a8_simd(1)
    avx2 = fn()(x, *banks, ids, weights)
    assert torch.equal(together, alone)
    if level >= 1:
        assert torch.equal(together, avx2)  # every SIMD level: the same bits
    want = registry.variants("moe_grouped_w4a8")["reference"].fn(x, *banks, ids, weights)
    torch.testing.assert_close(together, want, atol=1e-3, rtol=1e-4)


def test_thread_count_does_not_change_a_single_bit(banks):
    x, ids, weights = batch(5, 3, banks[2].shape[1])
    try:
        w4a16_cpu_c.set_num_threads(1)
        one = fn()(x, *banks, ids, weights)
        for count in (2, 3):
            w4a16_cpu_c.set_num_threads(count)
            assert torch.equal(fn()(x, *banks, ids, weights), one)
    finally:
        w4a16_cpu_c.set_num_threads(None)


def test_one_token_is_the_dense_w4a8_gemvs(banks):
    """At one token each expert is w4a8_gemv on x, then on h: the same integer kernels, so
    gate, up and down match the dense op's bits; only silu and the sum are computed apart."""
    w1, w3, w2 = banks
    x, ids, weights = batch(9, 1, w2.shape[1])
    got = fn()(x, *banks, ids, weights)[0]
    summed = torch.zeros(x.shape[1])
    for c in range(K):
        e = int(ids[0, c])
        gate, up = (w4a8_cpu_c.w4a8_gemv(x, bank.expert(e)) for bank in (w1, w3))
        h = F.silu(gate) * up
        summed = summed + weights[0, c] * w4a8_cpu_c.w4a8_gemv(h, w2.expert(e))[0]
    torch.testing.assert_close(got, summed, atol=1e-4, rtol=1e-5)


def test_refusals_name_the_problem():
    gen = torch.Generator().manual_seed(1)
    w1, w3, w2 = (experts(gen, 3, 32, 64, 16), experts(gen, 3, 32, 64, 16),
                  experts(gen, 3, 64, 32, 16))
    x, ids, weights = torch.randn(1, 64), torch.tensor([[0, 2]]), torch.rand(1, 2)
    for variant in ("cpu_c", "reference"):
        with pytest.raises(registry.KernelError, match="multiple of 32"):
            registry.variants("moe_grouped_w4a8")[variant].fn(x, w1, w3, w2, ids, weights)
    w1, w3, w2 = (experts(gen, 3, 32, 64, 32), experts(gen, 3, 32, 64, 32),
                  experts(gen, 3, 64, 32, 32))
    with pytest.raises(Exception, match="expert"):
        fn()(x, w1, w3, w2, torch.tensor([[0, 3]]), weights)
