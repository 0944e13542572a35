"""w4a16_grouped_gemv on CPU through the C helper: one pass over each selected expert.

The (route, output row) pairs are split across the helper's threads; no partial buffers.
"""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.w4a16_gemv.cpu_c import as_rows, c_weight, num_threads, out_buffer, workspace
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts, check_routes


def route_args(x: torch.Tensor, experts: PackedInt4Experts, expert_ids: torch.Tensor):
    """-> (x fp32 [1 or R, K], ids int64 [R], cffi x pointer, cffi ids pointer)."""
    k = experts.qweight.shape[-1] * 2
    x = as_rows(x, k)
    if expert_ids.dtype != torch.int64 or not expert_ids.is_contiguous():
        expert_ids = expert_ids.to(torch.int64).contiguous()
    routes = expert_ids.numel()
    if expert_ids.dim() != 1 or routes == 0 or x.shape[0] not in (1, routes):
        check_routes(x, experts, expert_ids)  # raises with the precise reason
    ffi = helper.ffi
    return (x, expert_ids, ffi.cast("float *", x.data_ptr()),
            ffi.cast("int64_t *", expert_ids.data_ptr()))


def raise_for(status: int, what: str, x, experts, expert_ids):
    if status == helper.lib.KH_EINVAL:
        check_routes(x, experts, expert_ids)  # names a bad expert id, if that was it
    helper.check(status, what)


@registry.register("w4a16_grouped_gemv", "cpu_c", devices=("cpu",),
                   description="C helper: selected experts' rows split across threads")
def w4a16_grouped_gemv(x: torch.Tensor, experts: PackedInt4Experts, expert_ids: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    cw = c_weight(experts)
    x, ids, x_ptr, ids_ptr = route_args(x, experts, expert_ids)
    routes = ids.numel()
    out = out_buffer(out, (routes, cw.n))
    lib, ffi = helper.lib, helper.ffi
    work = workspace(lib.gemv_w4a16_work_floats(x.shape[0], cw.k, cw.group))
    status = lib.grouped_gemv_w4a16(x_ptr, x.shape[0], ids_ptr, routes, experts.num_experts,
                                    cw.q, cw.s, cw.m, cw.n, cw.k, cw.group, work,
                                    ffi.cast("float *", out.data_ptr()), num_threads())
    if status:
        raise_for(status, "grouped_gemv_w4a16", x, experts, ids)
    return out


registry.set_default("w4a16_grouped_gemv", "cpu", "cpu_c")
