"""Triton launchers: constraint messages and the fixed config rule (kernels run interpreted)."""
import os
import sys

# As in test_ops_equivalence: if triton was imported before TRITON_INTERPRET=1 was
# set, these tests run in a fresh child process instead.
from tests.ops.helpers import interpreter_ready  # noqa: E402  (imports no triton)

os.environ.setdefault("TRITON_INTERPRET", "1")
TRITON_TOO_EARLY = "triton" in sys.modules and not interpreter_ready()

import pytest  # noqa: E402
import torch  # noqa: E402

from engined.ops import registry  # noqa: E402
from engined.ops.int4_format import PackedInt4  # noqa: E402
from engined.ops.paged_mla_decode import triton as mla_triton  # noqa: E402
from engined.ops.w4a16_gemv import triton as gemv_triton  # noqa: E402
from tests.ops.helpers import experts, random_int4, run_fresh  # noqa: E402
from tests.ops.layer_cases import PAGED_MLA  # noqa: E402

in_process = pytest.mark.skipif(TRITON_TOO_EARLY, reason="runs in test_in_a_fresh_process")


@pytest.fixture
def weight():
    return PackedInt4(group_size=32, **random_int4(torch.Generator().manual_seed(0), 16, 64, 32))


@in_process
def test_cpu_tensors_are_refused_when_not_interpreted(weight, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(registry.KernelError, match="needs CUDA tensors"):
        gemv_triton.w4a16_gemv(torch.randn(1, 64), weight)


@in_process
def test_launcher_messages(weight):
    with pytest.raises(registry.KernelError, match=r"x must be \[M, 64\]"):
        gemv_triton.w4a16_gemv(torch.randn(1, 63), weight)
    with pytest.raises(registry.KernelError, match="out must be a contiguous fp32, bf16 or fp16"):
        gemv_triton.w4a16_gemv(torch.randn(1, 64), weight, out=torch.empty(1, 15))
    strided = PackedInt4(weight.qweight.t().contiguous().t(), weight.scales, weight.mins, 32)
    with pytest.raises(registry.KernelError, match="must be contiguous"):
        gemv_triton.w4a16_gemv(torch.randn(1, 64), strided)


@in_process
@pytest.mark.parametrize("op", ["w4a16_grouped_gemv", "moe_swiglu"])
def test_routed_launchers_check_expert_ids(op):
    gen = torch.Generator().manual_seed(1)
    stacks = [experts(gen, 4, 8, 64, 32) for _ in range(2 if op == "moe_swiglu" else 1)]
    fn = registry.variants(op)["triton"].fn
    with pytest.raises(ValueError, match=r"expert ids must lie in 0\.\.3"):
        fn(torch.randn(1, 64), *stacks, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="non-empty 1-D integer"):
        fn(torch.randn(1, 64), *stacks, torch.tensor([[0]]))


@in_process
def test_configs_come_from_one_table(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    table = gemv_triton.configs()
    for n, k, rows in ((576, 576, 1), (4096, 2304, 1), (1024, 2304, 8)):
        cfg = gemv_triton.pick_config(n, k, 32, rows)
        assert cfg in table and all(name.isupper() for name in cfg if name.startswith("BLOCK"))
    # a tile's groups divide a row's (no idle lanes in the last tile), one group a thread
    assert gemv_triton.pick_config(2304, 4096, 32)["BLOCK_G"] == 32     # 128 groups a row
    assert gemv_triton.pick_config(12288, 2304, 32)["BLOCK_G"] == 8     # 72 = 9 x 8
    for cfg in table:
        assert cfg["BLOCK_N"] * cfg["BLOCK_G"] == 32 * cfg["num_warps"]


@in_process
def test_group_size_must_be_a_power_of_two():
    w = PackedInt4(group_size=6, **random_int4(torch.Generator().manual_seed(2), 4, 96, 6))
    with pytest.raises(registry.KernelError, match="power-of-two group size"):
        gemv_triton.w4a16_gemv(torch.randn(1, 96), w)


def test_paged_mla_splits_come_from_static_shapes():
    assert mla_triton.num_splits(1, 2, 32768) == 64     # batch 1 at 32k: 128 programs
    assert mla_triton.num_splits(8, 2, 32768) == 33     # 528 programs: four waves of 132 SMs
    assert mla_triton.num_splits(1, 2, 1000) == 8       # 128 keys a range at least
    assert mla_triton.num_splits(600, 2, 32768) == 1


@in_process
@pytest.mark.parametrize("case_id,min_keys,target", [("B8-", 16, 16), ("B2-H2-R64", 16, 528)])
def test_paged_mla_ranges_of_any_size_ignore_empty_partials(monkeypatch, case_id, min_keys, target):
    """Ranges of another size than the equivalence cases': longer than the minimum (B8: two
    per row, 32 keys), starting inside a block (B2: 32 keys in blocks of 64). Partials come
    NaN-filled, so a merge that read an empty range's accumulator shows."""
    case = next(c for c in PAGED_MLA if c.id.startswith(case_id))
    args = case.make(torch.Generator().manual_seed(case.seed))
    want = registry.variants("paged_mla_decode")["reference"].fn(*args)
    monkeypatch.setattr(mla_triton, "MIN_SPLIT_KEYS", min_keys)
    monkeypatch.setattr(mla_triton, "TARGET_PROGRAMS", target)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    got = mla_triton.paged_mla_decode(*args)
    torch.testing.assert_close(got, want, atol=case.atol, rtol=case.rtol)


@pytest.mark.skipif(not TRITON_TOO_EARLY, reason="the tests above ran in this process")
def test_in_a_fresh_process():
    run_fresh("tests/ops/test_triton.py", "not fresh_process")
