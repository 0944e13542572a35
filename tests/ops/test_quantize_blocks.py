"""x's int8 quantizer on AVX-512, 16 blocks at a time (kh_quantize_blocks_avx512: the blocks'
maxima and sums reduced together, d and 1/d one vector divide each) against the one-block
quantizer (kh_quantize_block_avx512, itself pinned to the portable C by tests/ops/test_w4a8.py):
the same codes, d and sums, bit for bit, for any count of blocks and any block's values."""
import ctypes

import pytest
import torch

import engined._kimi_helper
from engined import helper

LIB = ctypes.CDLL(engined._kimi_helper.__file__)


def awkward_blocks(nb: int, seed: int) -> torch.Tensor:
    """nb blocks of 32: ordinary, ties at d = 1, zeros, subnormal (d = 0), huge, one inf, one
    NaN, tiny beside large: one kind a block, in a seeded order -> [nb * 32] float32."""
    gen = torch.Generator().manual_seed(seed)
    ties = torch.zeros(32)
    ties[:8] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5, 126.5, -126.5, 1.4999999])
    inf, nan = torch.randn(32, generator=gen), torch.randn(32, generator=gen)
    inf[7], nan[19] = -float("inf"), float("nan")
    tiny = torch.randn(32, generator=gen) * 1e-30
    tiny[3] = 5e3
    kinds = [ties, torch.zeros(32), torch.full((32,), 1e-39), torch.linspace(-3e30, 1e30, 32),
             inf, nan, tiny]
    blocks = [torch.randn(32, generator=gen) * 10 ** float(torch.randint(-3, 4, (1,), generator=gen))
              for _ in range(nb)]
    for kind, b in zip(kinds, torch.randperm(nb, generator=gen).tolist()):
        blocks[b] = kind
    return torch.cat(blocks).contiguous()


def pointer(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


@pytest.mark.parametrize("deinterleave", [0, 1])
@pytest.mark.parametrize("nb", [1, 5, 15, 16, 17, 18, 31, 33, 48, 64])
def test_sixteen_blocks_at_a_time_give_each_blocks_own_bits(nb, deinterleave):
    if not LIB.kh_cpu_has_avx512vnni():
        pytest.skip(f"no AVX-512 VNNI here: {helper.INT8_LEVELS[helper.w4a8_simd()]} quantizes x")
    x = awkward_blocks(nb, seed=nb * 2 + deinterleave)
    codes = torch.full((nb * 32,), 99, dtype=torch.int8)
    d = torch.full((nb + 1,), -1.0)  # one past the end: must stay untouched
    sums = torch.full((nb + 1,), -7, dtype=torch.int32)
    LIB.kh_quantize_blocks_avx512(pointer(x), ctypes.c_int64(nb), pointer(codes), pointer(d),
                                  pointer(sums), deinterleave)
    LIB.kh_quantize_block_avx512.restype = ctypes.c_float
    want_codes = torch.empty(32, dtype=torch.int8)
    want_sum = ctypes.c_int32()
    for b in range(nb):
        want_d = LIB.kh_quantize_block_avx512(pointer(x[b * 32:]), pointer(want_codes),
                                              ctypes.byref(want_sum), deinterleave)
        assert torch.equal(codes[b * 32:(b + 1) * 32], want_codes), b
        assert d[b].view(torch.int32) == torch.tensor(want_d).view(torch.int32), (b, d[b], want_d)
        assert sums[b] == want_sum.value, b
    assert d[nb] == -1.0 and sums[nb] == -7
    if nb >= 7:  # every kind of block was there
        assert (d[:nb] == 0).any() and d[:nb].isinf().any() and (sums[:nb] == 0).any()
