"""The layer call's gated activation (csrc/kimi_act.c, kh_silu_mul: silu(g) * u) at each
level against torch's silu, and AVX-512 against AVX2 bit for bit: a row in a verify step runs
where a lone decode row runs, and greedy speculation's tokens depend on that."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

import engined._kimi_helper
from tests.support.simd import gemv_level_or_skip, gemv_levels
from engined import helper

LIB = ctypes.CDLL(engined._kimi_helper.__file__)
level = gemv_levels()


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(g, 123.0)
    LIB.kh_silu_mul(ctypes.c_void_p(g.data_ptr()), ctypes.c_void_p(u.data_ptr()),
                    ctypes.c_int64(g.numel()), ctypes.c_void_p(out.data_ptr()))
    return out


def awkward(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """g over silu's finite range (exp's clamps at +-88 included), 0 and -0; u ordinary."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) * 4
    special = torch.tensor([0.0, -0.0, 100.0, -100.0, 88.5, -87.5, 1e-30, 20.0, -20.0])
    g[torch.randperm(n, generator=gen)[:min(n, len(special))]] = special[:n]
    return g, torch.randn(n, generator=gen)


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 37, 1536])
def test_each_level_is_silu_times_up(level, n):
    g, u = awkward(n, seed=n)
    got = silu_mul(g, u)
    want = (F.silu(g.double()) * u.double()).float()
    torch.testing.assert_close(got, want, rtol=4e-7, atol=1e-35)  # below -88 exp saturates: |error| < 1e-36


@pytest.mark.parametrize("n", [16, 17, 31, 37, 1536, 8192])
def test_avx512_gives_the_avx2_bits(n):
    g, u = awkward(n, seed=100 + n)
    try:
        gemv_level_or_skip(2)
        wide = silu_mul(g, u)
        gemv_level_or_skip(1)
        narrow = silu_mul(g, u)
    finally:
        helper.gemv_simd(2)
    assert torch.equal(wide.view(torch.int32), narrow.view(torch.int32))
