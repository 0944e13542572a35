"""RMS norms: one RMSNorm for both models, and KDA's gated output norm (reference §2.1, §2.2)."""
import torch
import torch.nn.functional as F


class RMSNorm:
    """y = x / rms(x) * weight. fp32 inputs and weight run as one fused op; other dtypes keep
    HF's bit order (normalize in fp32, cast back to x's dtype, then times the weight)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.float32, device="cpu"):
        self.weight = torch.ones(dim, dtype=dtype, device=device)  # [D]; a loader fills it
        self.eps = eps
        self.shape = (dim,)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, eps: float) -> "RMSNorm":
        norm = cls(weight.shape[0], eps, torch.float32, weight.device)
        norm.weight = weight.float()
        return norm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D]
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
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
        return gated_rms(o, z, self.weight, self.eps)


def gated_rms(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS_eps(o) * weight * sigmoid(z) over the last dim, in fp32: o, z [..., K], weight [K]."""
    of = o.float()
    y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight.float() * torch.sigmoid(z.float())
