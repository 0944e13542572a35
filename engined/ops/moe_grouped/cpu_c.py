"""moe_grouped on CPU through the C helper, in one call: the routes sorted by expert, each
chosen expert's rows read once for all the tokens that chose it (gate/up with SwiGLU, then
down), and each token's weighted sum in choice order (as routes.combine)."""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.moe_grouped.routes import check_inputs
from engined.ops.w4a16_gemv.cpu_c import c_weight, num_threads


@registry.register("moe_grouped", "cpu_c", devices=("cpu",),
                   description="C helper: each chosen expert read once for all its rows")
def moe_grouped(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    try:
        return helper.moe_grouped(c_weight(w1), c_weight(w3), c_weight(w2), x, experts, weights,
                                  out, num_threads())
    except (ValueError, helper.HelperError) as exc:
        check_inputs(x, w1, w3, w2, experts, weights)  # names what is wrong, if it can
        if isinstance(exc, ValueError):
            raise registry.KernelError(f"moe_grouped: {exc}") from None
        raise


registry.set_default("moe_grouped", "cpu", "cpu_c")
