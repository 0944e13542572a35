"""Kimi-Linear norms (reference §2.1, §2.2 step 7): fp32 math, result in the input dtype."""
import torch


class KimiRMSNorm:
    """y = (x / rms(x)) in fp32, cast back to x's dtype, times the weight (HF bit order)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device="cpu"):
        self.weight = torch.ones(dim, dtype=dtype, device=device)  # [D]
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D]
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class GatedRMSNorm:
    """KDA output norm: RMS_eps(o) * w * sigmoid(z), per head, one [K] weight for all heads, fp32."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device="cpu"):
        self.weight = torch.ones(dim, dtype=dtype, device=device)  # [K]
        self.eps = eps

    def __call__(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # o, z: [T, H, K] -> fp32 [T, H, K]
        of = o.float()
        y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight.float() * torch.sigmoid(z.float())
