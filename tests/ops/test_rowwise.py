"""The CPU decode ops whose rows must not depend on their batch (ops/rowwise.py): each row of
a batch is, bit for bit, the op run on that row alone (fresh tensors, as a lone decode step
has them), its state updates included. Their agreement with the plain references is
tests/ops/test_equivalence.py's."""
import pytest
import torch

from engined import helper
from engined.layers.linear import Linear
from engined.ops import registry
from engined.ops.rowwise import rowwise
from tests.ops.decode_cases import KDA_DECODE, kda_decode_case
from tests.ops.layer_cases import PAGED_MLA


@pytest.mark.parametrize("case", [c for c in PAGED_MLA if not c.id.startswith("B1-")], ids=lambda c: c.id)
def test_paged_mla_rows_are_their_lone_results(case):
    q_lat, q_rope, pool, tables, lengths, scale = case.make(torch.Generator().manual_seed(case.seed))
    op = registry.resolve("paged_mla_decode", "cpu").fn
    batch = op(q_lat, q_rope, pool, tables, lengths, scale)
    for b in range(q_lat.shape[0]):
        row = slice(b, b + 1)
        lone = op(q_lat[row].clone(), q_rope[row].clone(), pool, tables[row].clone(),
                  lengths[row].clone(), scale)
        assert torch.equal(batch[b], lone[0]), b


@pytest.mark.parametrize("case", [c for c in KDA_DECODE if not c.id.startswith("B1-")], ids=lambda c: c.id)
def test_kda_decode_rows_and_their_states_are_their_lone_results(case):
    args = case.make(torch.Generator().manual_seed(case.seed))
    qkv, low, conv, S, slots = args[0], args[1], args[5], args[6], args[7]
    op = registry.resolve("kda_decode", "cpu").fn
    batch_conv, batch_S = conv.clone(), S.clone()
    batch = op(qkv, low, *args[2:5], batch_conv, batch_S, slots, *args[8:])
    for b in range(qkv.shape[0]):
        row = slice(b, b + 1)
        lone = op(qkv[row].clone(), low[row].clone(), *args[2:5], conv, S, slots[row].clone(), *args[8:])
        assert torch.equal(batch[b], lone[0]), b
    assert torch.equal(batch_conv, conv) and torch.equal(batch_S, S)


def test_rowwise_runs_each_cpu_row_alone_and_keeps_tuples():
    x = torch.randn(5, 24)
    w = torch.randn(40, 24)
    got = rowwise(torch.nn.functional.linear, x, w)
    for b in range(5):
        assert torch.equal(got[b], torch.nn.functional.linear(x[b:b + 1].clone(), w)[0])
    top, arg = rowwise(lambda r: torch.sigmoid(r).topk(3), x)
    assert top.shape == arg.shape == (5, 3)
    assert torch.equal(arg[2], torch.sigmoid(x[2:3].clone()).topk(3).indices[0])


@pytest.mark.skipif(not helper.available(), reason="the C helper is not built (make setup)")
def test_the_c_kda_step_at_the_48b_shape_and_after_its_weights_change():
    """32 heads of 128, 4 taps (Kimi-Linear 48B): the C variant against the reference, row by
    row; then f_b written in place (a reload): the next step reads the new weights."""
    case = kda_decode_case(3, 32, 128, 4, 4, seed=7)
    args = list(case.make(torch.Generator().manual_seed(case.seed)))
    c_variant, reference = (registry.variants("kda_decode")[n].fn for n in ("cpu_c", "reference"))
    for _ in range(2):
        pools = [a.clone() for a in args[5:7]]
        got = c_variant(*args[:5], *pools, *args[7:])
        want = reference(*args[:5], *[a.clone() for a in args[5:7]], *args[7:])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        args[2].mul_(1.5)                          # f_b, in place


def test_a_narrower_dense_weight_gives_decode_rows_their_lone_results():
    """fp16 weights under fp32 rows (a float16 checkpoint on the CPU): cast block by block,
    each decode row alone."""
    lin = Linear(48, 40, torch.float16)
    lin.weight.copy_(torch.randn(48, 40))
    x = torch.randn(6, 40)
    batch = lin(x)
    for b in range(6):
        assert torch.equal(batch[b], lin(x[b:b + 1].clone())[0]), b


@pytest.mark.parametrize("variant", ["reference", "cpu_rows", "cpu_c"])
def test_kda_decode_reads_each_row_from_its_source_slot(variant):
    """source (a verify step's draft rows, each from the row before it): the same as copying
    the source states to the rows' slots first, then the step; the C kernel reads them in
    place of the copy, and refuses a row whose source is another row's slot."""
    if variant == "cpu_c" and not helper.available():
        pytest.skip("the C helper is not built (make setup)")
    case = kda_decode_case(3, 2, 16, 4, 7, seed=9)
    args = list(case.make(torch.Generator().manual_seed(case.seed)))
    slots = args[7]
    source = torch.tensor([s for s in range(7) if s not in slots.tolist()][:3])
    op = registry.variants("kda_decode")[variant].fn
    copied = [a.clone() for a in args[5:7]]
    for pool in copied:
        pool.index_copy_(0, slots, pool.index_select(0, source))
    want = op(*args[:5], *copied, *args[7:])
    read = [a.clone() for a in args[5:7]]
    got = op(*args[:5], *read, *args[7:], source=source)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(read, copied))
    if variant == "cpu_c":
        with pytest.raises(Exception, match="source another row's slot"):
            op(*args[:5], *read, *args[7:], source=slots.roll(1))
