"""bench/int4_kernels.py's inputs are the model's: its MoE timing on a GPU is what decides
moe_grouped's CUDA default, so its x must take the path the model runs."""
import torch

from engined.weights import kimi_checkpoint
from tests.support import bench


def test_moe_timing_x_has_the_models_activation_dtype(monkeypatch):
    """x in kimi_checkpoint.act_dtype's dtype for the device (bf16 on CUDA: with fp32 x,
    triton_dot took its CUDA-core IEEE product, and the GPU A/B timed a path no request runs).
    Here on the CPU, the model's choice is replaced by bf16 to see that x follows it."""
    kernels, moe = bench.load("int4_kernels"), bench.load("int4_moe")
    calls = moe.moe_inputs(kernels, 3, torch.Generator().manual_seed(0), calls=2)
    assert [x.dtype for x, _, _ in calls] == [kimi_checkpoint.act_dtype("cpu")] * 2
    monkeypatch.setattr(kimi_checkpoint, "act_dtype", lambda device: torch.bfloat16)
    for x, picks, weights in moe.moe_inputs(kernels, 3, torch.Generator().manual_seed(0), calls=2):
        assert x.dtype == torch.bfloat16 and x.shape == (3, moe.MOE_D)
        assert picks.shape == (3, moe.MOE_TOP_K) and weights.dtype == torch.float32


def test_weights_off_the_cpu_take_the_gpu_order_the_engine_serves(monkeypatch):
    """On CUDA the engine reorders every INT4 bank into the GPU kernels' order, so the timed
    weights must be flagged so too (before, the kernels section timed the disk order's loop,
    which no CUDA request runs). "meta" stands in for the GPU here."""
    kernels = bench.load("int4_kernels")
    on_cpu = kernels.PackedInt4Experts(group_size=32, **kernels.random_packed(16, 64, (2,)))
    assert on_cpu.gpu_order is False
    monkeypatch.setattr(kernels, "DEVICE", "meta")
    for symmetric in (True, False):
        w = kernels.int4_format.PackedInt4(group_size=32,
                                           **kernels.random_packed(16, 64, symmetric=symmetric))
        assert w.gpu_order and w.qweight.device.type == "meta"


def test_the_decode_steps_moe_ffn_is_timed_as_the_model_calls_it(monkeypatch):
    """moe_decode (the step's routed MoE with its shared expert, at T <= 16 the op the model
    runs) at T = 1 and 8, each of its non-reference variants here; its bytes are the experts
    its routing chose, distinct over the rows, plus the shared expert. Small shapes."""
    from types import SimpleNamespace
    kernels, moe = bench.load("int4_kernels"), bench.load("int4_moe")
    for name, value in (("MOE_EXPERTS", 16), ("MOE_TOP_K", 4), ("MOE_D", 64), ("MOE_I", 32)):
        monkeypatch.setattr(moe, name, value)
    args = SimpleNamespace(working_set=1 << 20, min_time=0.0, reference=False)
    rows = moe.bench_moe_decode(kernels, args)
    assert [(r["op"], r["variant"]) for r in rows] == [("moe_decode", "composed")] * 2
    expert = 3 * kernels.packed_bytes(32, 64, True)
    one, eight = (r["bytes"] for r in rows)
    assert one == 4 * expert + expert                     # 4 distinct experts, the shared one
    assert 5 * expert < eight <= 16 * expert + expert and rows[1]["tok_s"] > 0
