"""Kimi-Linear's KDA states live in slots of one pool per layer: a cache owns a slot, batched
decode updates the rows' slots in place, and slots come back when caches go."""
import gc

import pytest
import torch

from engined.weights.kimi_checkpoint import load_kimi_linear
from tests.support import kimi_tiny


def test_a_cache_owns_a_slot_until_it_is_released(kimi):
    pool = kimi.state_pool
    before = pool.num_used
    a, b = kimi.new_cache(8), kimi.new_cache(8)
    assert a.slot != b.slot and pool.num_used == before + 2
    a.release()
    assert pool.num_used == before + 1
    c = kimi.new_cache(8)
    assert c.slot == a.slot                       # reused
    del b, c
    gc.collect()
    assert pool.num_used == before                # returned when garbage-collected


def test_growing_the_pool_keeps_live_states(kimi):
    cache = kimi.new_cache(8)
    kimi.forward(torch.tensor([3, 5, 7]), cache, 0)
    saved = cache.save_state()
    others = [kimi.new_cache(8) for _ in range(kimi.state_pool.num_slots + 2)]  # forces growth
    for i, state in cache.kda.items():
        assert torch.equal(state.S, saved[i].S) and torch.equal(state.conv, saved[i].conv)
    assert all(not s.S.any() for o in others for s in o.kda.values())          # new slots zeroed


def test_state_bytes_is_one_slot(kimi):
    cache = kimi.new_cache(4)
    assert kimi.state_bytes == sum(s.conv.nbytes + s.S.nbytes for s in cache.kda.values()) > 0


def test_batched_decode_updates_only_its_rows_slots(kimi):
    rows = [kimi.new_cache(8) for _ in range(3)]
    bystander = kimi.new_cache(8)
    for cache in (*rows, bystander):
        kimi.forward(torch.tensor([4, 2]), cache, 0)
    untouched = bystander.save_state()
    before = [c.save_state() for c in rows]
    kimi.decode_batch(torch.tensor([1, 2, 3]), rows, [2, 2, 2])
    for i, state in bystander.kda.items():
        assert torch.equal(state.S, untouched[i].S) and torch.equal(state.conv, untouched[i].conv)
    assert all(not torch.equal(c.kda[i].S, b[i].S) for c, b in zip(rows, before) for i in b)


def test_a_cache_of_another_pool_is_refused(kimi, tmp_path):
    other = load_kimi_linear(kimi_tiny.write_tiny_checkpoint(tmp_path / "o"), progress=False).model
    cache = other.new_cache(8)
    other.forward(torch.tensor([1]), cache, 0)
    with pytest.raises(ValueError, match="another model's state pool"):
        kimi.decode_batch(torch.tensor([1]), [cache], [1])
