import torch
import torch.nn.functional as F

from engined.layers.linear import Int4Linear


class SwiGLU:
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, gate: Int4Linear, up: Int4Linear, down: Int4Linear):
        self.gate, self.up, self.down = gate, up, down

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]; hidden: [T, F]
        return self.down(F.silu(self.gate(x)) * self.up(x))
