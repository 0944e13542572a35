"""paged_mla_decode's CPU variant splits a batch into groups that bound its gather: every
split gives the reference's answer (the equivalence cases fit in one group)."""
import pytest
import torch

from engined.ops import registry
from engined.ops.paged_mla_decode import cpu_batched
from tests.ops.helpers import PAGED_MLA


@pytest.mark.parametrize("group_bytes", [1, 3 * 64 * 24 * 4])   # one row, three 64-key rows
def test_groups_of_rows_match_the_reference(monkeypatch, group_bytes):
    case = next(c for c in PAGED_MLA if c.id.startswith("B8-"))
    args = case.make(torch.Generator().manual_seed(case.seed))
    want = registry.variants("paged_mla_decode")["reference"].fn(*args)
    monkeypatch.setattr(cpu_batched, "GROUP_BYTES", group_bytes)
    out = torch.full_like(want, float("nan"))
    got = cpu_batched.paged_mla_decode(*args, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, want, atol=case.atol, rtol=case.rtol)
