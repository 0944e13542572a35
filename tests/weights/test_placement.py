"""Placement of Kimi-Linear-48B's INT4 artifact between the GPU and RAM, planned from headers
only: the real 48B layout as header-only shards, built on the meta device with the selective
INT4 layouts, so every size below is the artifact's, byte for byte."""
import itertools
from types import SimpleNamespace

import pytest
import torch

from engined.config import MOE_CACHE_AUTO, EngineConfig
from engined.engine import memory as memcap
from engined.weights.placement import (
    CUDA_CONTEXT_BYTES, DEFAULT_MARGIN_BYTES, WORKSPACE_BYTES, GiB, PlacementError, default_gpu_budget,
    model_parts, plan_placement)
from tests.support import kimi_tiny
from tests.weights.test_kimi_loader import kimi_48b_config

# One MoE layer's routed experts: 3 banks x 256 experts x a [1024, 2304] INT4 matrix with
# symmetric groups of 32: codes 1024*2304/2 = 1,179,648 B + fp16 scales 1024*72*2 = 147,456 B.
ROUTED_PER_LAYER = 3 * 256 * (1_179_648 + 147_456)                  # 1,019,215,872 B = 0.95 GiB
SHARED = 26 * 3 * (1_179_648 + 147_456)                             # one shared expert per MoE layer
KDA_STATE = 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 3 * 2)           # fp32 S + bf16 conv windows
BUDGETS, CONTEXTS = (16, 24, 32), (8192, 32768, 131072)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from engined.models.kimi_linear import KimiLinearModel
    from engined.weights.kimi_checkpoint import open_checkpoint
    from engined.weights.synthetic import selective_int4
    path = tmp_path_factory.mktemp("placement") / "k48"
    kimi_tiny.write_header_only(path, kimi_48b_config())
    config = open_checkpoint(path).config
    return KimiLinearModel(config, torch.bfloat16, "meta", selective_int4(config), torch.bfloat16)


@pytest.fixture(scope="module")
def parts(model):
    return model_parts(model)


def test_parts_add_up_to_the_int4_artifact(model, parts):
    assert parts.attention + parts.shared_experts + parts.routed_bytes == model.weight_bytes
    assert [i for i, _ in parts.routed] == list(range(1, 27))       # layer 0 is dense
    assert {nbytes for _, nbytes in parts.routed} == {ROUTED_PER_LAYER}
    assert parts.shared_experts == SHARED
    assert parts.attention == 2_230_861_824                          # 2.08 GiB: all that is not an expert
    assert parts.state_bytes_per_sequence == KDA_STATE == 43_417_600
    assert parts.kv_bytes_per_token == 8_064
    # a prefill chunk's MLA attention per token of context, bf16: the latent 512 + 64, kv_b's
    # 32 x (128 + 128), keys 32 x (128 + 64), values padded to the keys' 192
    assert parts.prefill_bytes_per_token == 2 * (576 + 32 * 256 + 32 * 192 + 32 * 192) == 42_112


def test_the_24_gib_plan_at_32k_offloads_seven_layers(parts):
    """By hand: the GPU must hold attention 2,230,861,824 + shared 103,514,112 + cache
    (8,064 x 32,768 = 264,241,152 of latents + 43,417,600 x 9 slots = 390,758,400)
    + workspace (1,073,741,824 + a prefill's attention over 32,768 tokens, 42,112 x 32,768 =
    1,379,926,016) + context 805,306,368 = 6,248,349,696 B. 24 GiB = 25,769,803,776 leaves
    19,521,454,080 for routed experts: 19 layers (19,365,101,568) fit, 20 do not, so the first
    26 - 19 = 7 MoE layers (1..7) go to RAM."""
    placement = plan_placement(parts, "cuda", 32768, 8, 24 * GiB)
    assert placement.gpu["cache"] == 654_999_552
    assert placement.gpu["workspace"] == 2_453_667_840
    assert placement.offloaded == frozenset(range(1, 8))
    assert placement.gpu["routed experts"] == 19 * ROUTED_PER_LAYER
    assert placement.ram == {"routed experts": 7 * ROUTED_PER_LAYER}
    assert placement.gpu_total == 6_248_349_696 + 19 * ROUTED_PER_LAYER
    assert placement.reason == "planned for a 24.0 GiB GPU budget"


def test_the_prefix_cache_is_part_of_the_gpu_plan(parts):
    """--prefix-cache-bytes fills with latent rows and KDA states on the GPU: the 24 GiB plan
    at 32k above leaves 156,352,512 B beside its 19 layers of experts, so a 256 MiB prefix
    cache moves an eighth layer to RAM; serve's plan (memory.place) passes the flag's value."""
    placement = plan_placement(parts, "cuda", 32768, 8, 24 * GiB, prefix_cache=256 << 20)
    assert placement.gpu["prefix cache"] == 256 << 20
    assert placement.offloaded == frozenset(range(1, 9))
    assert placement.gpu_total == 6_248_349_696 + (256 << 20) + 18 * ROUTED_PER_LAYER <= 24 * GiB
    config = EngineConfig(model="synthetic:kimi-linear-48b", gpu_memory="24GiB", moe_cache=0)
    served = memcap.place(SimpleNamespace(parts=parts), config, "cuda", 32768)
    assert served.gpu["prefix cache"] == config.prefix_cache_bytes == 256 << 20
    assert served.offloaded == placement.offloaded


def test_experts_in_ram_beside_a_gpu_need_the_c_helper(parts, monkeypatch):
    """Without the helper the engine would start, then fail every request at its first
    offloaded layer: the plan refuses at once, saying why; a plan that keeps every expert
    on the GPU needs no helper."""
    monkeypatch.setattr(memcap.helper, "available", lambda: False)
    config = EngineConfig(model="synthetic:kimi-linear-48b", gpu_memory="24GiB", moe_cache=0)
    with pytest.raises(PlacementError, match="C helper, which is not built here"):
        memcap.place(SimpleNamespace(parts=parts), config, "cuda", 32768)
    roomy = EngineConfig(model="synthetic:kimi-linear-48b", gpu_memory="64GiB", moe_cache=0)
    assert not memcap.place(SimpleNamespace(parts=parts), roomy, "cuda", 32768).offloaded


def test_a_gpu_memory_above_the_free_memory_plans_with_what_is_free(parts, monkeypatch):
    """--gpu-memory 64GiB where 24 GiB are free: the plan is made for the 24 the cap will
    hold (it planned 64 and then refused the start, telling a GPU user to raise
    --memory-cap); an over-cap plan on the GPU names the GPU's flags."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (24 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a test GPU")
    config = EngineConfig(model="synthetic:kimi-linear-48b", gpu_memory="64GiB", moe_cache=0)
    placed = memcap.place(SimpleNamespace(parts=parts), config, "cuda", 32768)
    assert placed.gpu_budget == 24 * GiB and placed.offloaded == frozenset(range(1, 9))
    over = memcap.Budget(30 * GiB, 0, 0, 24 * GiB, "free memory of a test GPU")
    with pytest.raises(memcap.MemoryCapError, match="raise --gpu-memory"):
        memcap.enforce(over)


def test_counts_are_monotone_within_budget_and_minimal(parts):
    counts = {}
    for budget in BUDGETS:
        for context in CONTEXTS:
            placement = plan_placement(parts, "cuda", context, 8, budget * GiB)
            assert placement.gpu_total <= budget * GiB
            assert placement.gpu_total + placement.ram_total == (
                parts.attention + parts.shared_experts + parts.routed_bytes
                + parts.cache_bytes(context, 8) + WORKSPACE_BYTES
                + parts.prefill_bytes_per_token * context + CUDA_CONTEXT_BYTES)
            k = counts[budget, context] = len(placement.offloaded)
            assert placement.offloaded == frozenset(range(1, k + 1))  # the first k MoE layers
            if k:  # one more layer on the GPU would not fit
                assert placement.gpu_total + ROUTED_PER_LAYER > budget * GiB
                with pytest.raises(PlacementError, match=f"fewest layers that fit is --n-cpu-moe {k}"):
                    plan_placement(parts, "cuda", context, 8, budget * GiB, n_cpu_moe=k - 1)
    for budget, more in itertools.pairwise(BUDGETS):
        assert all(counts[more, c] <= counts[budget, c] for c in CONTEXTS)
    for context, longer in itertools.pairwise(CONTEXTS):
        assert all(counts[b, longer] >= counts[b, context] for b in BUDGETS)
    assert counts == {(16, 8192): 15, (16, 32768): 16, (16, 131072): 21,
                      (24, 8192): 6, (24, 32768): 7, (24, 131072): 12,
                      (32, 8192): 0, (32, 32768): 0, (32, 131072): 4}


def test_32_gib_holds_every_expert_at_8k_and_a_128k_prefill_moves_four(parts):
    """26.85 GiB of weights + 0.62 GiB of cache at 8k + 1.32 GiB workspace (1 GiB + a prefill's
    attention over 8k tokens, 42,112 B x 8,192) + 0.75 GiB context = 29.35 GiB. At 128k the
    latents add 0.98 GiB (8,064 B x 131,072) and the prefill's attention 5.14 GiB (42,112 B x
    131,072): 35.1 GiB, so the first 4 MoE layers' experts go to RAM."""
    at_8k = plan_placement(parts, "cuda", 8192, 8, 32 * GiB)
    assert not at_8k.offloaded and at_8k.ram_total == 0
    assert at_8k.gpu_total == 31_514_836_992                         # 29.35 GiB
    at_128k = plan_placement(parts, "cuda", 131072, 8, 32 * GiB)
    assert at_128k.offloaded == frozenset(range(1, 5))
    assert at_128k.gpu_total == 33_603_600_384                       # 31.30 GiB


def test_a_budget_below_what_must_stay_on_the_gpu_is_refused_with_the_numbers(parts):
    with pytest.raises(PlacementError) as err:
        plan_placement(parts, "cuda", 32768, 8, 2 * GiB)
    assert "needs 5.8 GiB of the 2.0 GiB budget" in str(err.value)
    assert "--gpu-memory" in str(err.value)
    with pytest.raises(PlacementError, match="even with every routed expert in RAM"):
        plan_placement(parts, "cuda", 32768, 8, 2 * GiB, cpu_moe=True)
    with pytest.raises(PlacementError, match="GPU budget of 0 B"):
        plan_placement(parts, "cuda", 32768, 8, 0)


def test_explicit_placement(parts):
    every = plan_placement(parts, "cuda", 32768, 8, 80 * GiB, cpu_moe=True)
    assert every.offloaded == frozenset(range(1, 27)) and every.gpu["routed experts"] == 0
    assert every.reason == "--cpu-moe"
    assert plan_placement(parts, "cuda", 32768, 8, 80 * GiB, cpu_moe=True, n_cpu_moe=3) == every
    first = plan_placement(parts, "cuda:0", 32768, 8, 80 * GiB, n_cpu_moe=3)
    assert first.device == "cuda" and first.offloaded == frozenset({1, 2, 3})
    assert first.ram == {"routed experts": 3 * ROUTED_PER_LAYER} and first.reason == "--n-cpu-moe 3"
    for bad in (27, -1):
        with pytest.raises(PlacementError, match="26 MoE layers"):
            plan_placement(parts, "cuda", 32768, 8, 80 * GiB, n_cpu_moe=bad)


def test_cpu_holds_every_byte_in_ram(model, parts):
    plain = plan_placement(parts, "cpu", 32768, 8, gpu_budget=24 * GiB)
    assert plain.gpu == {} and plain.gpu_budget == 0 and not plain.offloaded
    assert plain.ram_total == model.weight_bytes + parts.cache_bytes(32768, 8)
    hybrid = plan_placement(parts, "cpu", 32768, 8, n_cpu_moe=3)
    assert hybrid.offloaded == frozenset({1, 2, 3}) and hybrid.ram == plain.ram
    assert plan_placement(parts, "cpu", 32768, 8, cpu_moe=True).offloaded == frozenset(range(1, 27))
    with pytest.raises(PlacementError, match=r"must be 0\.\.26"):
        plan_placement(parts, "cpu", 32768, 8, n_cpu_moe=27)


def test_describe_names_each_part_and_both_totals(parts):
    lines = plan_placement(parts, "cuda", 32768, 8, 24 * GiB).describe()
    text = "\n".join(lines)
    for part in ("attention", "shared experts", "routed experts", "cache", "workspace", "CUDA context"):
        assert any(line.lstrip().startswith(part) for line in lines), part
    total = next(line for line in lines if line.lstrip().startswith("total"))
    assert total.split()[1:] == ["23.9", "GiB", "6.6", "GiB"]
    assert "routed experts of 7 of 26 MoE layers in RAM (layers 1..7)" in text
    assert "24.0 GiB" in text


def test_default_budget_leaves_the_margin():
    assert default_gpu_budget(80 * GiB) == 80 * GiB - DEFAULT_MARGIN_BYTES
    assert default_gpu_budget(DEFAULT_MARGIN_BYTES // 2) == 0


EXPERT = ROUTED_PER_LAYER // 256                                      # 3,981,312 B: one cache slot


def test_the_expert_cache_takes_what_the_24_gib_plan_leaves_in_whole_experts(parts):
    """The 24 GiB plan at 32k above leaves 25,769,803,776 - 6,248,336,384 - 19 x 1,019,215,872
    = 156,365,824 B: 39 experts of 3,981,312 B (155,271,168 B)."""
    assert parts.expert_bytes == EXPERT and parts.num_experts == 256
    placement = plan_placement(parts, "cuda", 32768, 8, 24 * GiB, moe_cache=MOE_CACHE_AUTO)
    assert placement.cache_slots == 39 and placement.gpu["expert cache"] == 39 * EXPERT
    assert placement.gpu_total <= 24 * GiB < placement.gpu_total + EXPERT
    assert "expert cache: 39 experts, 148.1 MiB (--moe-cache)" in placement.describe()[-1]
    sized = plan_placement(parts, "cuda", 32768, 8, 24 * GiB, moe_cache=128 * 2**20)
    assert sized.cache_slots == 33                                     # 134,217,728 // EXPERT
    off = plan_placement(parts, "cuda", 32768, 8, 24 * GiB)
    assert off.cache_slots == 0 and "expert cache" not in off.gpu
    assert off.describe()[-1] == "  expert cache: off"


def test_a_cache_that_does_not_fit_is_refused_with_the_numbers(parts):
    with pytest.raises(PlacementError) as err:
        plan_placement(parts, "cuda", 32768, 8, 24 * GiB, moe_cache=1 * GiB)
    assert "--moe-cache 1.0 GiB does not fit: 269 experts of 3.8 MiB need 1021.4 MiB" in str(err.value)
    assert "leaves 149.1 MiB of the GPU budget" in str(err.value)


def test_the_cache_is_for_experts_in_ram_and_never_larger_than_they_are(parts):
    every = plan_placement(parts, "cuda", 32768, 8, 80 * GiB, moe_cache=MOE_CACHE_AUTO)
    assert not every.offloaded and every.cache_slots == 0           # nothing in RAM to cache
    assert plan_placement(parts, "cuda", 32768, 8, 80 * GiB, moe_cache=1 * GiB).cache_slots == 0
    capped = plan_placement(parts, "cuda", 32768, 8, 80 * GiB, cpu_moe=True, moe_cache=MOE_CACHE_AUTO)
    assert capped.cache_slots == 26 * 256                            # every offloaded expert
    cpu = plan_placement(parts, "cpu", 32768, 8, cpu_moe=True, moe_cache=MOE_CACHE_AUTO)
    assert cpu.cache_slots == 0 and "expert cache" not in cpu.ram
