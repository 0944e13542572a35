"""Plain reference for gated_rmsnorm: layers/rmsnorm.GatedRMSNorm's fp32 math, then one
rounding to o's dtype (the dtype o_proj reads).

| tensor | shape     | dtype                                                  |
|--------|-----------|--------------------------------------------------------|
| o      | [T, H, K] | any float: the heads' outputs of kda_prefill           |
| z      | [T, H, K] | any float: the gate's pre-activation (g_b_proj(g_a))   |
| weight | [K]       | any float: one weight for every head                   |
| out    | [T, H, K] | o's dtype: RMS_eps(o) * weight * sigmoid(z), per head  |
"""
import torch

from engined.layers.rmsnorm import gated_rms  # imports only torch
from engined.ops import registry


def check_inputs(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor):
    if o.dim() != 3 or z.shape != o.shape or weight.shape != (o.shape[2],):
        raise ValueError(f"gated_rmsnorm: o and z [T, H, K] and weight [K] needed, got "
                         f"{list(o.shape)}, {list(z.shape)} and {list(weight.shape)}")


@registry.register("gated_rmsnorm", registry.REFERENCE,
                   description="GatedRMSNorm in fp32, rounded once to o's dtype")
def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    check_inputs(o, z, weight)
    y = gated_rms(o, z, weight, eps).to(o.dtype)
    return y if out is None else out.copy_(y)
