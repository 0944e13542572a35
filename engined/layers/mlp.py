"""SwiGLU feed-forward, for both models (Llama's MLP, Kimi-Linear's dense layer and shared experts)."""
import torch
import torch.nn.functional as F

from engined import helper
from engined.layers.linear import Linear


class SwiGLU:
    """down(silu(gate(x)) * up(x)). Attribute names follow the Kimi checkpoint
    (gate_proj, up_proj, down_proj). gate and up are rows of one stacked linear, `gate_up`
    (`empty` allocates it so; `fuse()` stacks two loaded INT4 linears): decode rows of an INT4
    stack run w4a16_swiglu, one pass that writes silu(gate) * up."""

    def __init__(self, gate_proj: Linear, up_proj: Linear, down_proj: Linear):
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.hidden = gate_proj.out_features
        self.gate_up: Linear | None = None

    @classmethod
    def empty(cls, hidden: int, inner: int, dtype, device="cpu",
              int4: dict[str, int] | None = None) -> "SwiGLU":
        """Slots for a loader to fill; int4: part name -> group size of the INT4 parts."""
        int4 = int4 or {}
        down = Linear(hidden, inner, dtype, device, int4.get("down_proj"))
        gate_up, (gate, up) = Linear.split(int4, ("gate_proj", "up_proj"), (inner, inner), hidden,
                                           dtype, device)
        mlp = cls(gate, up, down)
        mlp.gate_up = gate_up                  # gate and up are views of its rows: one GEMV
        return mlp

    def fuse(self, device="cpu") -> "SwiGLU":
        """Gate and up as one stacked linear (rows concatenated: outputs are bit-identical);
        gate_proj and up_proj become views of its rows, so the weights are held once."""
        self.gate_up = Linear.stacked([self.gate_proj, self.up_proj], device)
        self.view_rows()
        return self

    def to_tiles_(self, back: bool = False, op: str = "w4a8_tiles"):
        """The fused linears in (or out of) the CPU's tiles (Linear.to_tiles_, run by `op`);
        gate_proj and up_proj are made again as views of gate_up's rows (whole tiles: hidden
        % 16 == 0)."""
        for lin in (self.gate_up, self.down_proj):
            lin.to_tiles_(back, op)
        self.view_rows()

    def view_rows(self):
        """gate_proj and up_proj as views of gate_up's rows: again whenever gate_up's tensors
        get new storage (hugepages.gather_), or the old views would keep the old memory."""
        self.gate_proj = self.gate_up.rows(0, self.hidden)
        self.up_proj = self.gate_up.rows(self.hidden, 2 * self.hidden)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]; gate_up: [T, 2F]
        if self.gate_up is None:  # in place: at 200 tokens x 16384 each [T, F] is 13 MB
            return self.down_proj(F.silu(self.gate_proj(x), inplace=True).mul_(self.up_proj(x)))
        if self.gate_up.is_int4 and x.shape[0] <= helper.MAX_ROWS:  # decode rows: one pass
            return self.down_proj(self.gate_up.swiglu(x))
        gate_up = self.gate_up(x)
        gate, up = gate_up[:, :self.hidden], gate_up[:, self.hidden:]
        return self.down_proj(F.silu(gate).mul_(up))
