"""Plain fp32 reference for w4a16_grouped_gemv: route r computes x_r @ W[expert_ids[r]]^T.

| tensor     | shape              | dtype                     |
|------------|--------------------|---------------------------|
| x          | [1, K] or [R, K]   | any float (1 row: shared) |
| experts    | PackedInt4Experts  | [E, N, K/2] codes         |
| expert_ids | [R]                | integer, 0..E-1           |
| out        | [R, N]             | fp32                      |
"""
import torch

from engined.ops import int4_format, registry
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts, check_routes


@registry.register("w4a16_grouped_gemv", registry.REFERENCE,
                   description="dequantize each selected expert, then matmul")
def w4a16_grouped_gemv(x: torch.Tensor, experts: PackedInt4Experts, expert_ids: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    check_routes(x, experts, expert_ids)
    rows = []
    for r, e in enumerate(expert_ids.tolist()):
        xr = x[0 if x.shape[0] == 1 else r].float()  # [K]
        rows.append(int4_format.dequantize(experts.expert(e)) @ xr)  # [N, K] @ [K] -> [N]
    y = torch.stack(rows)  # [R, N]
    return y if out is None else out.copy_(y)
