"""--cpu-moe on the tiny BF16 Kimi-Linear checkpoint, as a new user tries it (issue 30 item 5):
on the CPU the flag is the no-op serve --help describes (the checkpoint loads and decodes as
without it); on CUDA the plan refuses before any weight is loaded, naming the quantize command
(planned from headers with --gpu-memory given, so no CUDA call is made)."""
import pytest
import torch

from engined.config import EngineConfig
from engined.engine import memory as memcap
from engined.weights import loader
from engined.weights.placement import PlacementError
from tests.support import kimi_tiny


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("bf16") / "ckpt")


def _plan(path, device, **flags):
    """serve's and doctor's one plan (memory.plan_memory) of the checkpoint's headers."""
    config = EngineConfig(model=str(path), **flags)
    return memcap.plan_memory(loader.plan_model(str(path), device=device), config, device, 256)


def _place(path, device, **flags):
    """Only the placement (plan_memory's first step; on CUDA its budget would ask the driver)."""
    config = EngineConfig(model=str(path), **flags)
    return memcap.place(loader.plan_model(str(path), device=device), config, device, 256)


def _greedy(model, steps=5):
    cache = model.new_cache(64)
    logits = model.forward(torch.tensor([5, 17, 30, 41]), cache, 0)
    tokens = []
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits = model.decode_batch(torch.tensor(tokens[-1:]), [cache], [cache.num_tokens])
    return tokens


@pytest.mark.parametrize("flags", [dict(cpu_moe=True), dict(n_cpu_moe=2)], ids=["cpu-moe", "n-cpu-moe"])
def test_on_the_cpu_the_flag_changes_nothing(bf16, flags):
    placement = _plan(bf16, "cpu", **flags).placement
    assert placement.offloaded == frozenset()
    assert "BF16 routed experts, already in RAM; nothing changes" in placement.reason
    assert placement.ram == _plan(bf16, "cpu").placement.ram
    flagged = loader.load_model(str(bf16), offload=placement.offloaded, progress=False).model
    plain = loader.load_model(str(bf16), progress=False).model
    assert flagged.offload_counters is None
    assert _greedy(flagged) == _greedy(plain)


@pytest.mark.parametrize("flags", [dict(cpu_moe=True), dict(n_cpu_moe=1), dict()],
                         ids=["cpu-moe", "n-cpu-moe", "planned"])
def test_on_cuda_experts_that_must_leave_the_gpu_are_refused_with_the_quantize_command(bf16, flags):
    parts = loader.plan_model(str(bf16), device="cuda").parts
    assert not parts.routed_int4
    # room for everything but half the routed experts: the planner would move some to RAM
    everything = _place(bf16, "cuda", gpu_memory="4GiB").gpu_total
    budget = everything - parts.routed_bytes // 2 if not flags else 4 * 2**30
    with pytest.raises(PlacementError) as err:
        _plan(bf16, "cuda", gpu_memory=budget, **flags)
    assert "need the INT4 artifact" in str(err.value)
    assert "kimi-engine quantize CHECKPOINT ARTIFACT" in str(err.value)


def test_on_cuda_bf16_experts_that_fit_are_planned_on_the_gpu(bf16):
    placement = _place(bf16, "cuda", gpu_memory="4GiB")
    assert placement.offloaded == frozenset() and placement.ram == {"routed experts": 0}
