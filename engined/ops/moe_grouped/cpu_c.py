"""moe_grouped on CPU through the C helper, in one call: the routes sorted by expert, each
chosen expert's rows read once for all the tokens that chose it (gate/up with SwiGLU, then
down), and each token's weighted sum in choice order (as routes.combine)."""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.moe_grouped.routes import check_inputs
from engined.ops.w4a16_gemv.cpu_c import launch


def grouped(op: str, x, w1, w3, w2, experts, weights, out, w4a8: bool) -> torch.Tensor:
    """The launch both moe_grouped variants share (w4a8: moe_grouped_w4a8's dots)."""
    return launch(op, helper.moe_grouped, (w1, w3, w2), x, experts, weights, out, w4a8=w4a8,
                  explain=lambda: check_inputs(x, w1, w3, w2, experts, weights))


@registry.register("moe_grouped", "cpu_c", devices=("cpu",),
                   description="C helper: each chosen expert read once for all its rows; x and "
                               "h rounded to int16 per block of 32 and integer dots on banks "
                               "in the CPU's tiles (every CPU), or in rows where "
                               "helper.moe_int16 says (AVX2 and up)")
def moe_grouped(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    return grouped("moe_grouped", x, w1, w3, w2, experts, weights, out, w4a8=False)


registry.set_default("moe_grouped", "cpu", "cpu_c")
