"""moe_grouped_w4a8 on CPU through the C helper, in one call: moe_grouped's routes and sums
(engined/ops/moe_grouped/cpu_c.py) with gemv_w4a8's quantization and integer kernels
(helper.w4a8_simd says which runs)."""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.moe_grouped.routes import check_inputs
from engined.ops.moe_grouped_w4a8.reference import check_group
from engined.ops.w4a16_gemv.cpu_c import c_weight, num_threads


@registry.register("moe_grouped_w4a8", "cpu_c", devices=("cpu",),
                   description="C helper: int8 x and h per 32-block, integer dots, "
                               "each chosen expert read once for all its rows")
def moe_grouped_w4a8(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    check_group(w1)
    try:
        return helper.moe_grouped(c_weight(w1), c_weight(w3), c_weight(w2), x, experts, weights,
                                  out, num_threads(), w4a8=True)
    except (ValueError, helper.HelperError) as exc:
        check_inputs(x, w1, w3, w2, experts, weights)  # names what is wrong, if it can
        if isinstance(exc, ValueError):
            raise registry.KernelError(f"moe_grouped_w4a8: {exc}") from None
        raise


registry.set_default("moe_grouped_w4a8", "cpu", "cpu_c")
