"""moe_grouped_w4a8 on CPU through the C helper, in one call: moe_grouped's routes and sums
(engined/ops/moe_grouped/cpu_c.py) with gemv_w4a8's quantization and integer kernels
(helper.w4a8_simd says which runs)."""
import torch

from engined.ops import registry
from engined.ops.moe_grouped.cpu_c import grouped
from engined.ops.moe_grouped_w4a8.reference import check_group


@registry.register("moe_grouped_w4a8", "cpu_c", devices=("cpu",),
                   description="C helper: int8 x and h per 32-block, integer dots, "
                               "each chosen expert read once for all its rows")
def moe_grouped_w4a8(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    check_group(w1)
    return grouped("moe_grouped_w4a8", x, w1, w3, w2, experts, weights, out, w4a8=True)


registry.set_default("moe_grouped_w4a8", "cpu", "cpu_c")
