"""The memory plan of a Kimi-Linear model holds what a prefill chunk's attention needs over the
whole context (MLA's latents gathered and expanded into keys and values), beside the weights
and the cache, in the activations' dtype of the device it plans for."""
import pytest

from engined.engine import memory
from engined.weights import loader

GiB = 1024**3
# per token of context, one MLA layer at a time: the latent 512 + 64, kv_b's 32 x (128 + 128),
# keys 32 x (128 + 64), values padded to 192: 21,056 elements
PREFILL_ELEMENTS = 576 + 32 * 256 + 32 * 192 + 32 * 192


def test_a_48b_plan_sizes_the_prefill_and_the_cache_in_the_devices_dtype():
    on_gpu, on_cpu = (loader.plan_model("synthetic:kimi-linear-48b", d) for d in ("cuda", "cpu"))
    assert on_gpu.parts.prefill_bytes_per_token == 2 * PREFILL_ELEMENTS == 42_112     # bf16
    assert on_cpu.parts.prefill_bytes_per_token == 4 * PREFILL_ELEMENTS == 84_224     # fp32
    assert on_gpu.kv_bytes_per_token == 7 * 576 * 2 and on_cpu.kv_bytes_per_token == 7 * 576 * 4


def test_the_cpu_budget_refuses_a_context_whose_prefill_would_not_fit():
    """A 128k context on the CPU: the fp32 prefill attention is 10.3 GiB beside the weights
    and the latents; a cap that holds those two but not it refuses to start, saying why."""
    plan = loader.plan_model("synthetic:kimi-linear-48b", "cpu")
    budget = memory.plan_budget(plan, 131072, 0, "cpu")
    assert budget.prefill_bytes == 84_224 * 131072
    tight = memory.plan_budget(plan, 131072, budget.weight_bytes + budget.kv_bytes + GiB, "cpu")
    with pytest.raises(memory.MemoryCapError, match=r"prefill attention 10\.3 GiB"):
        memory.enforce(tight)


def test_the_prefills_room_is_reserved_so_the_cache_cannot_take_it(monkeypatch):
    """Weights 700 and a prefill's 2 x 20 = 40 reserved at start against a cap of 1000: the
    KV (10 x 20) still fits, one byte more than what is left does not (the prefix cache and
    the sequences' KV reserve through the same counter, and evict or wait when refused)."""
    monkeypatch.setattr(memory.helper, "available", lambda: False)
    monkeypatch.setattr(memory, "_reservations", memory.Reservations())
    memory.enforce(memory.Budget(700, 10, 20, 1000, "--memory-cap", prefill_bytes_per_token=2))
    assert memory.reserved() == 740
    memory.reserve(200)
    with pytest.raises(memory.MemoryCapExceeded):
        memory.reserve(61)
