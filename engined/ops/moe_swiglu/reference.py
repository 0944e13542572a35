"""Plain fp32 reference for moe_swiglu: route r computes silu(x_r @ G_e^T) * (x_r @ U_e^T),
e = expert_ids[r] (the gate and up projections of the selected experts of one token).

| tensor     | shape             | dtype                     |
|------------|-------------------|---------------------------|
| x          | [1, K] or [R, K]  | any float (1 row: shared) |
| gate, up   | PackedInt4Experts | [E, N, K/2] codes each    |
| expert_ids | [R]               | integer, 0..E-1           |
| out        | [R, N]            | fp32                      |
"""
import torch

from engined.ops import registry
from engined.ops.w4a16_grouped_gemv import reference as grouped
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts


@registry.register("moe_swiglu", registry.REFERENCE,
                   description="two reference grouped GEMVs, then silu(gate) * up")
def moe_swiglu(x: torch.Tensor, gate: PackedInt4Experts, up: PackedInt4Experts,
               expert_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    if gate.shape != up.shape or gate.group_size != up.group_size:
        raise ValueError(f"gate {gate.shape} and up {up.shape} stacks differ")
    g = grouped.w4a16_grouped_gemv(x, gate, expert_ids)  # [R, N]
    u = grouped.w4a16_grouped_gemv(x, up, expert_ids)    # [R, N]
    y = torch.nn.functional.silu(g) * u
    return y if out is None else out.copy_(y)
