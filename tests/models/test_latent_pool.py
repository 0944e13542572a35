"""Kimi-Linear's MLA latents live in fixed-size blocks of one pool: a cache holds the blocks of
its own max_tokens until it is released, rows read and write through its block table across
block edges, growth keeps live rows, and batched decode over rows that straddle blocks equals
lone forwards."""
import gc

import pytest
import torch

from engined.models.latent_pool import BLOCK, LatentPool
from tests.support.batching import decode_together_and_alone


def test_a_cache_holds_the_blocks_of_its_max_tokens_until_released(kimi):
    pool = kimi.latent_pool
    before = pool.num_used
    a, b = kimi.new_cache(1), kimi.new_cache(2 * BLOCK + 1)
    assert len(a.blocks) == 1 and len(b.blocks) == 3 and not set(a.blocks) & set(b.blocks)
    assert pool.num_used == before + 4
    a.release()
    assert pool.num_used == before + 3
    c = kimi.new_cache(BLOCK)
    assert c.blocks == a.blocks                        # the freed block is handed out again
    del b, c
    gc.collect()
    assert pool.num_used == before                     # returned when garbage-collected
    with pytest.raises(ValueError, match="not all in use"):
        pool.release(a.blocks)                         # released twice


def test_rows_read_and_write_across_block_edges_and_only_their_own_blocks(kimi):
    cache, bystander = kimi.new_cache(3 * BLOCK), kimi.new_cache(3 * BLOCK)
    gen = torch.Generator().manual_seed(0)
    rows = {i: torch.randn(BLOCK + 10, w, generator=gen) for i, w in kimi.latent_pool.widths.items()}
    cache.write_rows(BLOCK - 5, rows)                  # positions 59..132: three blocks
    got = cache.read_rows(BLOCK - 5, 2 * BLOCK + 5)
    for i, want in rows.items():
        assert torch.equal(got[i], want)
        assert not cache.read_rows(0, BLOCK - 5)[i].any()          # before: still zero
        assert not bystander.read_rows(0, 3 * BLOCK)[i].any()      # other blocks untouched
    cache.reset()
    assert not any(r.any() for r in cache.read_rows(0, 3 * BLOCK).values())


def test_growing_the_pool_keeps_live_rows_and_hands_out_zeroed_blocks(kimi):
    cache = kimi.new_cache(2 * BLOCK)
    kimi.forward(torch.arange(1, BLOCK + 9), cache, 0)
    saved = cache.read_rows(0, BLOCK + 8)
    assert all(r.abs().sum(-1).gt(0).all() for r in saved.values())   # every position written
    pool = kimi.latent_pool
    others = [kimi.new_cache(BLOCK) for _ in range(len(pool.free_blocks) + 2)]  # forces growth
    for i, rows in cache.read_rows(0, BLOCK + 8).items():
        assert torch.equal(rows, saved[i])
    assert all(not r.any() for o in others for r in o.read_rows(0, BLOCK).values())


def test_allocate_grows_by_what_is_missing_and_reserve_keeps_addresses():
    pool = LatentPool({0: 8, 2: 8}, torch.float32, "cpu")
    pool.reserve(5)
    address = pool.latents[0].data_ptr()
    first = pool.allocate(3)
    assert first == [0, 1, 2] and pool.num_blocks == 5 and pool.latents[0].data_ptr() == address
    pool.latents[0][1].fill_(7.0)
    second = pool.allocate(4)                          # 2 free, 2 missing
    assert second == [3, 4, 5, 6] and pool.num_blocks == 7
    assert (pool.latents[0][1] == 7).all() and pool.latents[0].shape == (7, BLOCK, 8)
    pool.release(first)
    assert pool.allocate(1) == [0] and not pool.latents[0][0].any()


def test_batched_decode_across_block_edges_equals_lone_forwards(kimi):
    """Rows whose next position is the last of a block, the first of the next, and deep in a
    third, decoded together through paged_mla_decode, against the prefill path's gather."""
    prompts = [list(range(1, BLOCK)), list(range(2, BLOCK + 2)), list(range(3, 2 * BLOCK + 6)), [5]]
    together, alone = decode_together_and_alone(kimi, prompts, capacity=3 * BLOCK, same_argmax=False)
    for a, b in zip(together, alone):
        for i, rows in a.read_rows(0, a.num_tokens).items():
            torch.testing.assert_close(rows, b.read_rows(0, b.num_tokens)[i], atol=1e-6, rtol=1e-5)
