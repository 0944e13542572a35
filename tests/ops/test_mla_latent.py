"""mla_latent's reference stores what MLA.decode_batch stores today: [kv_a_layernorm(c) ; kr]
in the pool's dtype, at each row's position through its block table (so wiring the op into
the layer changes no bit of the cache)."""
import pytest
import torch

from engined.layers.mla import LATENT_EPS
from engined.layers.rmsnorm import RMSNorm
from engined.ops import registry


@pytest.mark.parametrize("act,pool_dtype", [(torch.float32, torch.float32),
                                            (torch.bfloat16, torch.bfloat16),
                                            (torch.bfloat16, torch.float32)])
def test_reference_stores_what_mla_stores(act, pool_dtype):
    gen = torch.Generator().manual_seed(3)
    r, p, block = 40, 8, 64
    positions = torch.tensor([0, 63, 64, 130])
    tables = torch.tensor([[5, 0, 0], [1, 0, 0], [4, 2, 0], [0, 0, 3]])
    norm = RMSNorm(r, LATENT_EPS, act)
    norm.weight = (1 + 0.2 * torch.randn(r, generator=gen)).to(act)
    kv = (3 * torch.randn((4, r + p), generator=gen)).to(act)
    pool = torch.randn((6, block, r + p), generator=gen).to(pool_dtype)

    want = torch.cat((norm(kv[:, :r]), kv[:, r:]), -1).to(pool_dtype)   # MLA._latent
    want_pool = pool.clone()
    at = tables.gather(1, (positions // block)[:, None])[:, 0] * block + positions % block
    want_pool.view(-1, r + p).index_copy_(0, at, want)                  # MLA.decode_batch

    got = registry.variants("mla_latent")[registry.REFERENCE].fn(kv, norm.weight, LATENT_EPS, pool,
                                                                 tables, positions)
    exact = act != torch.float32    # fp32 runs F.rms_norm's fused kernel in the layer
    tol = dict(atol=0, rtol=0) if exact else dict(atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(pool, want_pool, **tol)
