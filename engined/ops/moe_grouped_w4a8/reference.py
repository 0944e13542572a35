"""Plain reference for moe_grouped_w4a8: moe_grouped's, with each projection's input rounded
as w4a8_gemv's reference rounds it (int8 per block of 32, fp32 steps as C), float64 dots.

| tensor   | shape             | dtype                                         |
|----------|-------------------|-----------------------------------------------|
| x        | [T, D]            | any float                                     |
| w1, w3   | PackedInt4Experts | [E, I, D/2] codes (gate, up), group % 32 == 0 |
| w2       | PackedInt4Experts | [E, D, I/2] codes (down)                      |
| experts  | [T, k]            | integer, 0..E-1                               |
| weights  | [T, k]            | float                                         |
| out      | [T, D]            | fp32                                          |

h = silu(q8(x_t) W1_e^T) * (q8(x_t) W3_e^T) in fp32, then out[t] = sum_k weights[t, k] *
q8(h) W2_e^T. h is rounded to int8 after fp32 sums whose order differs from C's, so a value
at a rounding tie may land one code away: the equivalence cases allow for that.
"""
import torch
import torch.nn.functional as F

from engined.ops import int4_format, registry
from engined.ops.moe_grouped.routes import check_inputs
from engined.ops.w4a8_gemv.reference import BLOCK, dequantize_rows, quantize_rows


def check_group(w1):
    if w1.group_size % BLOCK:
        raise registry.KernelError(f"moe_grouped_w4a8: the group size must be a multiple of "
                                   f"{BLOCK}, got {w1.group_size} (use moe_grouped)")


def q8(rows: torch.Tensor, top: int = 127) -> torch.Tensor:
    """[n, K] -> the float64 x the integer dots see (top=32767: int16 codes)."""
    return dequantize_rows(*quantize_rows(rows, top))


def rounded_experts(x, w1, w3, w2, experts, weights, top: int = 127) -> torch.Tensor:
    """moe_grouped with each projection's input rounded per block of 32 to codes in
    -top..top: 127 is moe_grouped_w4a8, 32767 moe_grouped's W4A16 integer dots (where
    helper.moe_int16 says they run). [T, D] fp32."""
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(experts).tolist():
        tok, choice = (experts == e).nonzero(as_tuple=True)
        w = [int4_format.dequantize(bank.expert(e)).double() for bank in (w1, w3, w2)]
        xe = q8(x[tok].float(), top)                                      # [n, D] float64
        h = F.silu((xe @ w[0].t()).float()) * (xe @ w[1].t()).float()    # [n, I] fp32
        down = (q8(h, top) @ w[2].t()).float()                            # [n, D]
        y.index_add_(0, tok, down * weights[tok, choice].float().unsqueeze(-1))
    return y


@registry.register("moe_grouped_w4a8", registry.REFERENCE,
                   description="dequantize each chosen expert, q8 inputs, float64 matmuls")
def moe_grouped_w4a8(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    check_inputs(x, w1, w3, w2, experts, weights)
    check_group(w1)
    y = rounded_experts(x, w1, w3, w2, experts, weights)
    return y if out is None else out.copy_(y)
