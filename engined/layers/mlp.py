import torch
import torch.nn.functional as F

from engined.layers.linear import Int4Linear


class SwiGLU:
    """down(silu(gate(x)) * up(x)); gate and up run as one stacked GEMV."""

    def __init__(self, gate: Int4Linear, up: Int4Linear, down: Int4Linear):
        self.hidden = gate.out_features
        self.gate_up, self.down = Int4Linear.stacked([gate, up]), down

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]; gate_up: [T, 2F]
        gate_up = self.gate_up(x)
        gate, up = gate_up[:, :self.hidden], gate_up[:, self.hidden:]
        return self.down(F.silu(gate).mul_(up))
