"""w4a16_grouped_gemv on CPU through the C helper: one pass over each selected expert.

The (route, output row) pairs are split across the helper's threads; no partial buffers.
`routed` is the launcher this op and moe_swiglu's cpu_c variant share.
"""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.w4a16_gemv.cpu_c import launch
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts, check_routes


def routed(call, stacks: list[PackedInt4Experts], x: torch.Tensor, expert_ids: torch.Tensor,
           out: torch.Tensor | None) -> torch.Tensor:
    """helper `call` (grouped_gemv or moe_swiglu) on the stacks: x [1 or R, K] any float,
    expert_ids [R] integers in 0..E-1 -> out [R, N] fp32."""
    return launch(call.__name__, call, tuple(stacks), x, expert_ids, out,
                  explain=lambda: check_routes(x, stacks[0], expert_ids))  # names a bad route


@registry.register("w4a16_grouped_gemv", "cpu_c", devices=("cpu",),
                   description="C helper: selected experts' rows split across threads")
def w4a16_grouped_gemv(x: torch.Tensor, experts: PackedInt4Experts, expert_ids: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    return routed(helper.grouped_gemv, [experts], x, expert_ids, out)


registry.set_default("w4a16_grouped_gemv", "cpu", "cpu_c")
