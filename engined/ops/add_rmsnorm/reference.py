"""Plain reference for add_rmsnorm: h += delta (rounded to h's dtype, as `h + delta` is), then
the RMS norm of the new h with layers/rmsnorm.RMSNorm's rounding (normalized in fp32, cast to
h's dtype, then times the weight).

| tensor | shape  | dtype                                            |
|--------|--------|--------------------------------------------------|
| h      | [B, D] | the residual stream, any float; updated in place |
| delta  | [B, D] | or None (the first layer: no add)                |
| weight | [D]    | any float                                        |
| out    | [B, D] | h's dtype: weight * (h / rms(h))                 |
"""
import torch

from engined.ops import registry


def check_inputs(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor):
    if h.dim() != 2 or weight.shape != (h.shape[1],):
        raise ValueError(f"add_rmsnorm: h [B, D] and weight [D] needed, got {list(h.shape)} "
                         f"and {list(weight.shape)}")
    if delta is not None and delta.shape != h.shape:
        raise ValueError(f"add_rmsnorm: delta must be {list(h.shape)}, got {list(delta.shape)}")


@registry.register("add_rmsnorm", registry.REFERENCE,
                   description="h.add_(delta), then RMSNorm's fp32 normalization")
def add_rmsnorm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
    check_inputs(h, delta, weight)
    if delta is not None:
        h.add_(delta)
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    y = (weight * y.to(h.dtype)).to(h.dtype)
    return y if out is None else out.copy_(y)
