"""moe_swiglu on CPU through the C helper: gate and up rows of each selected expert
in one pass, silu(gate) * up in registers; no [R, N] gate/up intermediates."""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.w4a16_grouped_gemv.cpu_c import routed
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts


@registry.register("moe_swiglu", "cpu_c", devices=("cpu",),
                   description="C helper: fused gate/up GEMV rows with the SwiGLU epilogue")
def moe_swiglu(x: torch.Tensor, gate: PackedInt4Experts, up: PackedInt4Experts,
               expert_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    if gate.shape != up.shape or gate.group_size != up.group_size:
        raise ValueError(f"gate {gate.shape} and up {up.shape} stacks differ")
    return routed(helper.moe_swiglu, [gate, up], x, expert_ids, out)


registry.set_default("moe_swiglu", "cpu", "cpu_c")
