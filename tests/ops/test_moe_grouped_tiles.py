"""moe_grouped_w4a8 on expert stacks in the CPU's tiles (csrc/kimi_moe_tiles.c; W4A16 on
them: test_moe_grouped_i16_tiles.py): the reference's numbers, and the same bits at every
integer-dot level (the tile kernels' own promise); at one token each chosen expert is
w4a8_tiles on x, then on h; a token's result the same bits alone or batched and at any
thread count; clear refusals of what the tiles are not for."""
import pytest
import torch
import torch.nn.functional as F

from engined import helper
from engined.helper.core import ffi, lib
from engined.ops import int4_format, registry
from engined.ops.w4a16_gemv import cpu_c as w4a16_cpu_c
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts
from tests.ops.helpers import banks_and_tiles, shared_routes
from tests.support.simd import int8_levels

E, K = 16, 4

level = int8_levels()


def fn():
    return registry.variants("moe_grouped_w4a8")["cpu_c"].fn


@pytest.fixture(scope="module", params=[(256, 128, False), (96, 160, True)],
                ids=["asymmetric", "symmetric"])
def banks(request):
    d, inner, symmetric = request.param
    return banks_and_tiles(d, E, d, inner, 32, symmetric)


def batch(seed: int, tokens: int, d: int):
    return shared_routes(seed, tokens, d, E, K)


@pytest.mark.parametrize("tokens", [1, 3, 11])
def test_tiles_give_the_references_numbers_and_one_set_of_bits(banks, level, tokens):
    rows, tiles = banks
    x, ids, weights = batch(level + tokens, tokens, rows[2].shape[1])
    together = fn()(x, *tiles, ids, weights)
    alone = torch.cat([fn()(x[t:t + 1], *tiles, ids[t:t + 1], weights[t:t + 1])
                       for t in range(tokens)])
    assert torch.equal(together, alone)     # 11 rows of one segment: blocks of 8, then 3
    helper.w4a8_simd(0)                     # the portable tiles_c: the tile kernels' bits
    assert torch.equal(fn()(x, *tiles, ids, weights), together)
    want = registry.variants("moe_grouped_w4a8")["reference"].fn(x, *rows, ids, weights)
    torch.testing.assert_close(together, want, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(
        registry.variants("moe_grouped_w4a8")["reference"].fn(x, *tiles, ids, weights), want,
        atol=0, rtol=0)                     # the reference reads tiles as it reads rows


def test_one_token_is_the_dense_tile_kernel(banks):
    """Gate, up and down are w4a8_tiles on the expert's tiles: the same quantization and
    kernels; only silu and the sum are computed apart."""
    _, (w1, w3, w2) = banks
    x, ids, weights = batch(9, 1, w2.shape[1])
    got = fn()(x, w1, w3, w2, ids, weights)[0]
    tiles = registry.variants("w4a8_tiles")["cpu_c"].fn
    summed = torch.zeros(x.shape[1])
    for c in range(K):
        e = int(ids[0, c])
        h = F.silu(tiles(x, w1.expert(e))) * tiles(x, w3.expert(e))
        summed = summed + weights[0, c] * tiles(h, w2.expert(e))[0]
    torch.testing.assert_close(got, summed, atol=1e-4, rtol=1e-5)


def test_thread_count_does_not_change_a_single_bit(banks):
    _, tiles = banks
    x, ids, weights = batch(5, 12, tiles[2].shape[1])
    try:
        w4a16_cpu_c.set_num_threads(1)
        one = fn()(x, *tiles, ids, weights)
        for count in (2, 3):
            w4a16_cpu_c.set_num_threads(count)
            assert torch.equal(fn()(x, *tiles, ids, weights), one)
    finally:
        w4a16_cpu_c.set_num_threads(None)


def test_what_the_tiles_are_not_for_is_refused(banks):
    rows, tiles = banks
    x, ids, weights = batch(3, 2, rows[2].shape[1])
    for op in ("moe_grouped_w4a8", "moe_grouped"):
        with pytest.raises(registry.KernelError, match="all be in the CPU's tiles, or none"):
            registry.variants(op)["cpu_c"].fn(x, tiles[0], rows[1], rows[2], ids, weights)
    with pytest.raises(registry.KernelError, match="in the CPU's tiles"):
        registry.variants("w4a16_grouped_gemv")["cpu_c"].fn(x[:1], tiles[0], ids[0])


def test_a_stack_in_tiles_is_refused_where_one_linear_is_meant(banks):
    rows, tiles = banks
    x = torch.randn(1, rows[0].shape[2])
    with pytest.raises(registry.KernelError, match="not an expert stack"):
        registry.variants("w4a8_tiles")["cpu_c"].fn(x, tiles[0])
    with pytest.raises(registry.KernelError, match="in the CPU's tiles"):
        registry.variants("moe_swiglu")["cpu_c"].fn(x, tiles[0], tiles[1], torch.tensor([1]))
    with pytest.raises(int4_format.FormatError, match="does not go into tiles"):
        tiles[0].to_tiles()                      # twice would scramble it
    with pytest.raises(int4_format.FormatError, match="GPU order"):
        PackedInt4Experts(rows[0].qweight, rows[0].scales, rows[0].mins, 32,
                          gpu_order=True).to_tiles()


def test_the_c_call_refuses_banks_that_mix_layouts(banks):
    """The C entry points check for themselves (a caller other than helper.moe_grouped)."""
    rows, tiles = banks
    handles = [w4a16_cpu_c.c_weight(b) for b in (*tiles, *rows)]
    x, ids, weights = batch(3, 1, rows[2].shape[1])
    ids, out = ids.to(torch.int64).contiguous(), torch.empty_like(x)
    for gate, up, down, call in ((0, 4, 5, lib.moe_grouped_w4a16), (0, 4, 5, lib.moe_grouped_w4a8),
                                 (3, 4, 2, lib.moe_grouped_w4a8), (3, 4, 2, lib.moe_grouped_w4a16)):
        bank = ffi.new("KhExperts *")
        for part, h in zip((bank.gate, bank.up, bank.down), (handles[gate], handles[up],
                                                             handles[down])):
            part.q, part.s, part.m, part.n, part.k, part.group = h.q, h.s, h.m, h.n, h.k, h.group
            part.tiled = int(h.tiled)
        bank.num_experts = E
        _, work = helper.core._workspace(int(lib.moe_grouped_work_floats(K, x.shape[1],
                                                                         rows[0].shape[1], 32)))
        status = call(bank, ffi.cast("float *", x.data_ptr()), 1, K,
                      ffi.cast("int64_t *", ids.data_ptr()),
                      ffi.cast("float *", weights.data_ptr()), work,
                      ffi.cast("float *", out.data_ptr()), 1)
        assert status == int(lib.KH_EINVAL), (gate, up, down)
