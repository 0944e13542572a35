"""Kimi-Linear's graph step (the decode a CUDA graph captures, run eagerly on the CPU): the same
tokens as forward, padded rows that touch only scratch, and a refusal once the pools move."""
import pytest
import torch

from engined.commands import bench as synthetic_bench
from engined.models.kimi_graph_step import PoolsMoved


@pytest.fixture(scope="module")
def model():
    return synthetic_bench.build("tiny", "cpu", int4=True)


def prefilled(model, prompts, max_tokens=32):
    caches = [model.new_cache(max_tokens) for _ in prompts]
    firsts = [int(model.forward(torch.tensor(p), c, 0).argmax()) for p, c in zip(prompts, caches)]
    return caches, firsts


def test_padded_graph_step_gives_forwards_tokens_step_after_step(model):
    prompts = [[3, 5, 7, 11], [2, 9], [40, 41, 42]]
    caches, tokens = prefilled(model, prompts)
    alone, _ = prefilled(model, prompts)
    step = model.graph_step(4, 256)                 # 3 rows padded to a bucket of 4
    positions = [len(p) for p in prompts]
    for _ in range(5):
        step.load(tokens, caches, positions)
        logits = step.run()[:3]
        step.finish(caches, positions)
        for b, cache in enumerate(alone):
            lone = model.forward(torch.tensor([tokens[b]]), cache, positions[b])[0]
            assert (logits[b] - lone).abs().max() <= 1e-5 * lone.abs().max()
            assert int(logits[b].argmax()) == int(lone.argmax())
        tokens = [int(row.argmax()) for row in logits]
        positions = [p + 1 for p in positions]
    assert [c.num_tokens for c in caches] == positions


def test_a_padded_row_touches_only_scratch(model):
    caches, tokens = prefilled(model, [[1, 2, 3]])
    bystander, _ = prefilled(model, [[7, 7]])
    before = bystander[0].save_state(), bystander[0].read_rows(0, 2)
    step = model.graph_step(2, 256)
    step.load(tokens, caches, [3])
    step.run()
    state, rows = bystander[0].save_state(), bystander[0].read_rows(0, 2)
    for i in state:
        assert torch.equal(state[i].S, before[0][i].S) and torch.equal(state[i].conv, before[0][i].conv)
    assert all(torch.equal(rows[i], before[1][i]) for i in rows)
    scratch = model.scratch_cache()
    assert any(s.S.any() for s in scratch.kda.values())     # the padded row wrote there


def test_a_step_refuses_to_load_once_the_pools_moved(model):
    step = model.graph_step(1, 64)
    model.state_pool.reserve(model.state_pool.num_slots + 1)   # reallocates the slots
    caches, tokens = prefilled(model, [[5]])
    with pytest.raises(PoolsMoved):
        step.load(tokens, caches, [1])


def test_a_step_sends_its_rows_in_one_copy(model):
    """Tokens, slots, block tables and positions: one tensor made, one copy into the step's
    (on a GPU each copy is a host-to-device transfer before the replay; four before)."""
    from tests.support.host_copies import host_copies
    caches, tokens = prefilled(model, [[3, 5, 7], [2, 9]])
    step = model.graph_step(4, 256)
    counts = host_copies(lambda: step.load(tokens, caches, [3, 2]))
    assert (counts["lift_fresh"], counts["copy_"] + counts["_to_copy"]) == (1, 1)
    assert step.tokens.tolist() == tokens + [0, 0]
    assert step.inputs.positions.tolist() == [3, 2, 0, 0]
    assert step.inputs.slots.tolist()[:2] == [c.slot for c in caches]
    assert step.inputs.block_tables[1].tolist() == caches[1].blocks * step.max_blocks
