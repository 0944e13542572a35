"""Kimi-Linear verifies drafts (speculative decoding, engine/speculate.py): on the CPU a decode
row gives bit for bit what a lone step gives, in any batch, and a sequence's input token and
drafts run as consecutive rows of one step, each row's KDA state in a slot of its own. Whichever
draft is rejected first, the sequence continues from the last accepted position exactly as
plain decoding does; rejected rows leave nothing behind.

The plain run is the independent reference: the same model decoding one token a step, alone.
Two models: the tiny real-format checkpoint (dense bf16 weights) and synthetic:tiny (selective
INT4: the C helper's GEMVs, the grouped experts, the shared expert)."""
import pytest
import torch

from engined import helper
from engined.weights import synthetic

pytestmark = pytest.mark.skipif(not helper.available(), reason="the C helper is not built: the "
                                "CPU's row-exact kernels are its (make setup)")

PROMPTS = [[4, 2, 9, 11, 3], [7, 7, 3], [1, 5, 6, 8, 10, 12, 14]]
STEPS = 9


@pytest.fixture(scope="module", params=["checkpoint", "synthetic-int4"])
def model(request, kimi):
    return kimi if request.param == "checkpoint" else synthetic.load("synthetic:tiny").model


def prefill(model, prompt):
    cache = model.new_cache(64)
    first = int(model.forward(torch.tensor(prompt), cache, 0).argmax())
    return cache, first


def plain(model, prompt, steps=STEPS):
    """Greedy, one row a step, alone -> (tokens after the prompt, each step's logits [V])."""
    cache, token = prefill(model, prompt)
    tokens, logits = [token], []
    for i in range(steps):
        row = model.decode_batch(torch.tensor([token]), [cache], [len(prompt) + i])[0]
        token = int(row.argmax())
        tokens.append(token)
        logits.append(row)
    return tokens, logits


def test_a_row_in_a_batch_is_its_lone_step_bit_for_bit(model):
    want = [plain(model, p) for p in PROMPTS]
    caches, tokens = zip(*(prefill(model, p) for p in PROMPTS))
    caches, tokens = list(caches), list(tokens)
    for i in range(STEPS):
        rows = model.decode_batch(torch.tensor(tokens), caches, [len(p) + i for p in PROMPTS])
        for b, (ids, logits) in enumerate(want):
            assert torch.equal(rows[b], logits[i]), (b, i, (rows[b] - logits[i]).abs().max())
        tokens = [ids[i + 1] for ids, _ in want]


def test_each_layers_ffn_gives_a_row_its_lone_result(model):
    """The FFNs on random rows, batches of 2..8: the router's sigmoid over 8 experts once took
    the vector path for a batch and the scalar one for a row alone (a weight 1 ulp apart),
    which the logits above hid at times."""
    gen = torch.Generator().manual_seed(0)
    for layer in model.layers:
        for rows in range(2, 9):
            f = torch.randn(rows, model.config.hidden_size, generator=gen)
            batch = layer.ffn(f.clone())
            for b in range(rows):
                assert torch.equal(batch[b], layer.ffn(f[b:b + 1].clone())[0]), (rows, b)


@pytest.mark.parametrize("rejected", range(6))   # 5 drafts: the first wrong one, or none
def test_verify_rows_and_the_rollback_at_every_position(model, rejected):
    prompt, k = PROMPTS[0], 5
    ids, logits = plain(model, prompt)
    cache, _ = prefill(model, prompt)
    drafts = ids[1:1 + k]
    if rejected < k:
        drafts[rejected] = (drafts[rejected] + 1) % model.config.vocab_size
    start = len(prompt)
    rows = model.decode_batch(torch.tensor([ids[0], *drafts]), [cache] * (k + 1),
                              list(range(start, start + k + 1)))
    for j in range(rejected + 1):                 # rows whose inputs were all right
        assert torch.equal(rows[j], logits[j]), j
    # the sequence goes on from the draws: rows 0..rejected stand, the rest are dropped
    at = start + rejected + 1
    for i in range(rejected + 1, STEPS):
        row = model.decode_batch(torch.tensor([ids[i]]), [cache], [at])[0]
        assert torch.equal(row, logits[i]), i
        at += 1


def test_sequences_verify_different_draft_counts_beside_plain_rows(model):
    """Three sequences in one step: 3 drafts (all right), none, and 6 (the second wrong), so
    the step has 12 rows: two parts of at most 8, one sequence's rows in both."""
    want = [plain(model, p) for p in PROMPTS]
    counts, wrong = [3, 0, 6], [None, None, 1]
    caches = [prefill(model, p)[0] for p in PROMPTS]
    tokens, owners, positions = [], [], []
    for b, ((ids, _), n, w) in enumerate(zip(want, counts, wrong)):
        drafts = list(ids[1:1 + n])
        if w is not None:
            drafts[w] = (drafts[w] + 1) % model.config.vocab_size
        tokens += [ids[0], *drafts]
        owners += [caches[b]] * (n + 1)
        positions += range(len(PROMPTS[b]), len(PROMPTS[b]) + n + 1)
    rows = model.decode_batch(torch.tensor(tokens), owners, positions).split([n + 1 for n in counts])
    accepted = [3, 0, 1]
    for b, (ids, logits) in enumerate(want):
        for j in range(accepted[b] + 1):
            assert torch.equal(rows[b][j], logits[j]), (b, j)
    # one plain step for all three, each from its own last accepted position
    step = model.decode_batch(torch.tensor([want[b][0][a + 1] for b, a in enumerate(accepted)]),
                              caches, [len(p) + a + 1 for p, a in zip(PROMPTS, accepted)])
    for b, (ids, logits) in enumerate(want):
        assert torch.equal(step[b], logits[accepted[b] + 1]), b


def test_draft_slots_are_kept_by_the_sequence_and_returned_with_it(model):
    pool = model.state_pool
    before = pool.num_used
    cache, token = prefill(model, PROMPTS[0])
    start = len(PROMPTS[0])
    model.decode_batch(torch.tensor([token] * 4), [cache] * 4, list(range(start, start + 4)))
    assert pool.num_used == before + 4 and len(set(cache.slots)) == 4
    model.decode_batch(torch.tensor([token] * 3), [cache] * 3, list(range(start + 2, start + 5)))
    assert pool.num_used == before + 4            # reused, not taken again
    cache.release()
    assert pool.num_used == before


def test_a_step_refuses_positions_the_state_cannot_continue_from(model):
    cache, token = prefill(model, PROMPTS[1])
    start = len(PROMPTS[1])
    with pytest.raises(ValueError, match="can only continue at position"):
        model.decode_batch(torch.tensor([token]), [cache], [start + 1])
    model.decode_batch(torch.tensor([token] * 3), [cache] * 3, [start, start + 1, start + 2])
    with pytest.raises(ValueError, match="not one the last step reached"):
        model.decode_batch(torch.tensor([token]), [cache], [start + 4])
    with pytest.raises(ValueError, match="consecutive"):
        other, _ = prefill(model, PROMPTS[1])
        model.decode_batch(torch.tensor([token] * 3), [cache, other, cache], [start + 3, start, start + 4])


def test_a_graph_step_continues_after_a_verify_step(model):
    """The runner's graph step (eager here) after an eager verify step: it resumes from the
    last accepted row's slot, and leaves the cache as a plain step does."""
    prompt = PROMPTS[0]
    ids, logits = plain(model, prompt)
    cache, _ = prefill(model, prompt)
    start = len(prompt)
    model.decode_batch(torch.tensor(ids[:4]), [cache] * 4, list(range(start, start + 4)))
    step = model.graph_step(1, 256)
    for i in (4, 5):                              # all 3 drafts stood: on from position start + 4
        step.load([ids[i]], [cache], [start + i])
        assert torch.equal(step.run()[0], logits[i]), i
        step.finish([cache], [start + i])
    assert cache.num_tokens == start + 6 and cache.verified is None


def test_a_pinned_batched_kernel_turns_verifying_off(model, monkeypatch):
    assert model.verifies_drafts
    monkeypatch.setenv("KIMI_KERNELS", "kda_decode=reference")   # batched torch: not row-exact
    assert not model.verifies_drafts


def test_the_state_between_a_verify_step_and_its_resume_is_not_read(model):
    cache, token = prefill(model, PROMPTS[1])
    start = len(PROMPTS[1])
    model.decode_batch(torch.tensor([token] * 2), [cache] * 2, [start, start + 1])
    with pytest.raises(ValueError, match="once the next step resumes"):
        cache.save_state()


def test_a_verify_steps_rows_reach_the_device_in_one_tensor(model):
    """slots, tables, positions and every KDA pass's rows, slots and sources: one tensor made
    from the host's values (on a GPU one transfer; 3 + 3 a pass before), the same values."""
    from engined.models.kimi_rows import step_rows
    from tests.support.host_copies import host_copies
    caches = [prefill(model, p)[0] for p in PROMPTS[:2]]
    owners, positions, row_of = [caches[0]] * 3 + [caches[1]], [5, 6, 7, 3], [0, 1, 2, 0]
    made = []
    counts = host_copies(lambda: made.append(step_rows(owners, positions, row_of, "cpu")))
    rows = made[0]
    assert counts["lift_fresh"] == 1
    assert rows.positions.tolist() == positions
    assert rows.slots.tolist() == caches[0].slots[:3] + [caches[1].slots[0]]
    assert [p.rows.tolist() for p in rows.passes] == [[0, 3], [1], [2]]
    assert rows.passes[0].source is None
    assert rows.passes[2].source.tolist() == [caches[0].slots[1]]
