"""moe_swiglu on CPU through the C helper: gate and up rows of each selected expert
in one pass, silu(gate) * up in registers; no [R, N] gate/up intermediates."""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.w4a16_gemv.cpu_c import c_weight, num_threads, out_buffer, workspace
from engined.ops.w4a16_grouped_gemv.cpu_c import raise_for, route_args
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts


@registry.register("moe_swiglu", "cpu_c", devices=("cpu",),
                   description="C helper: fused gate/up GEMV rows with the SwiGLU epilogue")
def moe_swiglu(x: torch.Tensor, gate: PackedInt4Experts, up: PackedInt4Experts,
               expert_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    cg, cu = c_weight(gate), c_weight(up)
    if gate.shape != up.shape or cg.group != cu.group:
        raise ValueError(f"gate {gate.shape} and up {up.shape} stacks differ")
    x, ids, x_ptr, ids_ptr = route_args(x, gate, expert_ids)
    routes = ids.numel()
    out = out_buffer(out, (routes, cg.n))
    lib, ffi = helper.lib, helper.ffi
    work = workspace(lib.gemv_w4a16_work_floats(x.shape[0], cg.k, cg.group))
    status = lib.moe_swiglu_w4a16(x_ptr, x.shape[0], ids_ptr, routes, gate.num_experts,
                                  cg.q, cg.s, cg.m, cu.q, cu.s, cu.m, cg.n, cg.k, cg.group,
                                  work, ffi.cast("float *", out.data_ptr()), num_threads())
    if status:
        raise_for(status, "moe_swiglu_w4a16", x, gate, ids)
    return out


registry.set_default("moe_swiglu", "cpu", "cpu_c")
