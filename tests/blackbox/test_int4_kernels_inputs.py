"""bench/int4_kernels.py's inputs are the model's: its MoE timing on a GPU is what decides
moe_grouped's CUDA default, so its x must take the path the model runs."""
import torch

from engined.weights import kimi_checkpoint
from tests.support import bench


def test_moe_timing_x_has_the_models_activation_dtype(monkeypatch):
    """x in kimi_checkpoint.act_dtype's dtype for the device (bf16 on CUDA: with fp32 x,
    triton_dot took its CUDA-core IEEE product, and the GPU A/B timed a path no request runs).
    Here on the CPU, the model's choice is replaced by bf16 to see that x follows it."""
    kernels = bench.load("int4_kernels")
    calls = kernels.moe_inputs(3, torch.Generator().manual_seed(0), calls=2)
    assert [x.dtype for x, _, _ in calls] == [kimi_checkpoint.act_dtype("cpu")] * 2
    monkeypatch.setattr(kimi_checkpoint, "act_dtype", lambda device: torch.bfloat16)
    for x, picks, weights in kernels.moe_inputs(3, torch.Generator().manual_seed(0), calls=2):
        assert x.dtype == torch.bfloat16 and x.shape == (3, kernels.MOE_D)
        assert picks.shape == (3, kernels.MOE_TOP_K) and weights.dtype == torch.float32
