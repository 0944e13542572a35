"""Plain fp32 reference for moe_grouped: the routed experts of T tokens, summed per token.

| tensor   | shape             | dtype                               |
|----------|-------------------|-------------------------------------|
| x        | [T, D]            | any float                           |
| w1, w3   | PackedInt4Experts | [E, I, D/2] codes (gate, up)        |
| w2       | PackedInt4Experts | [E, D, I/2] codes (down)            |
| experts  | [T, k]            | integer, 0..E-1 (the router's picks)|
| weights  | [T, k]            | float (the mixing weights)          |
| out      | [T, D]            | fp32                                |

out[t] = sum_k weights[t, k] * (silu(x_t W1_e^T) * (x_t W3_e^T)) W2_e^T, e = experts[t, k].
"""
import torch
import torch.nn.functional as F

from engined.ops import int4_format, registry
from engined.ops.moe_grouped.routes import check_inputs


@registry.register("moe_grouped", registry.REFERENCE,
                   description="dequantize each chosen expert once, matmul its tokens")
def moe_grouped(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    check_inputs(x, w1, w3, w2, experts, weights)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(experts).tolist():
        tok, choice = (experts == e).nonzero(as_tuple=True)
        xe = x[tok].float()                                               # [n, D]
        w = [int4_format.dequantize(bank.expert(e)) for bank in (w1, w3, w2)]
        h = F.silu(xe @ w[0].t()) * (xe @ w[1].t())                       # [n, I]
        y.index_add_(0, tok, (h @ w[2].t()) * weights[tok, choice].float().unsqueeze(-1))
    return y if out is None else out.copy_(y)
