import torch


class RotaryEmbedding:
    """Rotate-half RoPE (the Hugging Face layout); the repack un-permutes GGUF's q/k rows to it.
    cos/sin rows are computed once per position and kept in a table that grows on demand."""

    def __init__(self, head_dim: int, theta: float):
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.inv_freq = 1.0 / (theta ** exponents)  # [hd/2]
        self._cos = self._sin = torch.empty(0, head_dim)  # [P, hd]: positions 0..P-1

    def _angles(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + length, dtype=torch.int64).float()
        freqs = positions[:, None] * self.inv_freq[None, :]  # [T, hd/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
        sin = angles.sin()
        sin[:, :freqs.shape[1]].neg_()  # rotate-half's sign folded in: see apply
        return angles.cos(), sin

    def _grow(self, end: int):
        if end > self._cos.shape[0]:
            size = max(end, 2 * self._cos.shape[0], 1024)
            self._cos, self._sin = self._angles(0, size)

    def cos_sin(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        # -> cos, sin: [T, hd] for positions start..start+length-1 (sin's first half negated)
        self._grow(start + length)
        return self._cos[start:start + length], self._sin[start:start + length]

    def at_positions(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # -> cos, sin: [B, hd], row i for positions[i]
        self._grow(max(positions) + 1)
        first = positions[0]
        if positions == list(range(first, first + len(positions))):  # one row, or a verify step
            return self.cos_sin(first, len(positions))  # views: no gather (each op runs cold)
        index = torch.tensor(positions)
        return self._cos[index], self._sin[index]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, H, hd]; cos, sin: [T, hd] from cos_sin. rotate_half(x) * sin equals
        # swap_halves(x) * sin with sin's first half negated (a sign flip rounds the same).
        half = x.shape[-1] // 2
        swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
        return swapped.mul_(sin[:, None, :]).addcmul_(x, cos[:, None, :])
