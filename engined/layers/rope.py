import torch


class RotaryEmbedding:
    """Rotate-half RoPE (the Hugging Face layout); the repack un-permutes GGUF's q/k rows to it."""

    def __init__(self, head_dim: int, theta: float):
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.inv_freq = 1.0 / (theta ** exponents)  # [hd/2]

    def cos_sin(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + length, dtype=torch.int64).float()
        freqs = positions[:, None] * self.inv_freq[None, :]  # [T, hd/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
        return angles.cos(), angles.sin()

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, H, hd]; cos, sin: [T, hd]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]
