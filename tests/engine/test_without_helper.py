"""What serve does without the compiled C helper (the GPU image): the memory cap is counted in
Python with the helper's arithmetic, a CUDA plan is capped by the GPU's free memory, and CPU
INT4 ops default to their reference kernels (engine/memory.py, engine/kernels.py)."""
import pytest
import torch

from engined import helper
from engined.engine import kernels, memory
from engined.ops import registry
from engined.weights.plan import LoadPlan

GiB = 1 << 30


def test_reservations_count_as_the_c_helper_does():
    # the same known answers as tests/ops/test_helper.py's memcap tests
    cap = memory.Reservations()
    cap.arm(100)
    cap.reserve(60)
    with pytest.raises(helper.MemoryCapExceeded):
        cap.reserve(50)
    assert cap.used == 60
    cap.reserve(40)
    cap.release(70)
    assert (cap.used, cap.peak) == (30, 100)
    with pytest.raises(ValueError, match="only 30 bytes"):
        cap.release(31)
    cap.release(30)
    assert (cap.used, cap.peak) == (0, 100)
    cap.arm(0)  # no cap
    cap.reserve(1 << 62)
    assert (cap.used, cap.peak) == (1 << 62, 1 << 62)


def test_without_the_helper_the_engine_counts_in_python(monkeypatch):
    before = helper.memcap_reserved() if helper.available() else None
    monkeypatch.setattr(memory.helper, "available", lambda: False)
    monkeypatch.setattr(memory, "_reservations", memory.Reservations())
    memory.enforce(memory.Budget(700, 10, 20, 1000))  # weights 700 + KV 200 fit 1000
    memory.reserve(200)
    with pytest.raises(memory.MemoryCapExceeded):  # what loop.py and prefix_cache.py catch
        memory.reserve(101)
    memory.release(200)
    assert memory.reserved() == 700
    if before is not None:
        assert helper.memcap_reserved() == before  # the C counter was not touched


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * GiB, 16 * GiB))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(memory, "cgroup_memory_limit", lambda **roots: 1 * GiB)


def test_a_cuda_plan_is_capped_by_free_gpu_memory_not_the_cgroup(fake_gpu):
    plan = LoadPlan(weight_bytes=6 * GiB, kv_bytes_per_token=1 << 20, context_length=8192)
    budget = memory.plan_budget(plan, 4096, 0, "cuda")
    assert (budget.cap_bytes, budget.cap_source) == (10 * GiB, "free memory of Fake GPU")
    assert not budget.is_over_cap  # 6 GiB + 4 GiB KV
    assert memory.plan_budget(plan, 4096, 12 * GiB, "cuda").cap_bytes == 10 * GiB
    assert memory.plan_budget(plan, 4096, 4 * GiB, "cuda").cap_source == "--gpu-memory"
    # routed experts kept in RAM leave the device plan, and are checked against the host cap
    assert not memory.plan_budget(plan, 8192, 0, "cuda", in_ram=4 * GiB).is_over_cap  # 2 + 8
    memory.check_host(1 * GiB, 0)                      # the fake cgroup's 1 GiB holds it
    with pytest.raises(memory.MemoryCapError, match="routed experts kept in RAM"):
        memory.check_host(1 * GiB + 1, 0)
    assert memory.plan_budget(plan, 8192, 0, "cuda").is_over_cap  # 6 GiB + 8 GiB KV
    assert memory.plan_budget(plan, 4096, 0, "cpu").cap_source == "cgroup memory.max"


@pytest.fixture
def no_helper(monkeypatch):
    """helper.available() is False; every op's CPU default is put back afterwards."""
    monkeypatch.setattr(kernels.helper, "available", lambda: False)
    monkeypatch.delenv("KIMI_KERNELS", raising=False)
    defaults = {op: registry.selected_name(op, "cpu") for op in registry.ops()}
    yield
    for op, name in defaults.items():
        registry.set_default(op, "cpu", name)


def test_cpu_ops_that_need_the_helper_fall_back_to_reference(no_helper):
    chosen = {op: registry.selected_name(op, "cpu") for op in registry.ops()}
    needing = [op for op, name in chosen.items() if name in kernels.HELPER_VARIANTS]
    assert "w4a16_gemv" in needing
    assert kernels.settle("cpu") == needing
    assert {op: registry.resolve(op, "cpu").name for op in registry.ops()} == {
        op: registry.REFERENCE if op in needing else name for op, name in chosen.items()}
    assert kernels.settle("cpu") == []  # settled once
    assert "w4a16_gemv" in kernels.describe_fallback(needing)


def test_cuda_kernels_do_not_change_without_the_helper(no_helper):
    chosen = {op: registry.selected_name(op, "cuda") for op in registry.ops()}
    assert kernels.settle("cuda") == []
    assert {op: registry.selected_name(op, "cuda") for op in registry.ops()} == chosen


def test_a_helper_kernel_pinned_by_kimi_kernels_is_refused(no_helper, monkeypatch):
    monkeypatch.setenv("KIMI_KERNELS", "w4a16_gemv=cpu_c")
    with pytest.raises(registry.KernelError, match="w4a16_gemv=cpu_c, which needs the C helper"):
        kernels.settle("cpu")


def test_with_the_helper_nothing_changes(monkeypatch):
    if not helper.available():
        pytest.skip("the C helper is not built here")
    monkeypatch.delenv("KIMI_KERNELS", raising=False)
    assert kernels.settle("cpu") == []
    assert registry.resolve("w4a16_gemv", "cpu").name == "cpu_c"


def test_only_a_large_model_trades_prefill_speed_for_its_peak(monkeypatch):
    """settle_allocator: glibc's mmap threshold is fixed only for a GiB or more in RAM (the
    default model keeps its served prefill speed; CPU-only Kimi-Linear keeps its peak)."""
    calls = []
    monkeypatch.setattr(memory, "return_large_frees", lambda: calls.append(1) or True)
    assert memory.settle_allocator(124 << 20) is False and calls == []
    assert memory.settle_allocator(1 << 30) is True and calls == [1]
