import torch


class RMSNorm:
    """y = x / rms(x) * weight, in fp32."""

    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight.float()  # [D]
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D]
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))
