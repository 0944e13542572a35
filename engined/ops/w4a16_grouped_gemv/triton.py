"""w4a16_grouped_gemv in Triton: one program per (route, BLOCK_N outputs of its expert).

Same single-row GEMV along contiguous K as w4a16_gemv (int4_dot); the
expert id is read from the router's tensor inside the kernel, so there is no host
sync and no per-call partial buffer. Memory traffic per output element: K/2 code
bytes + 4*K/G bytes of scale and min (2*K/G when symmetric) of the selected expert, read
once.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.w4a16_gemv.triton import (as_rows, check_packed, code_words, int4_dot,
                                           mins_arg, out_buffer, pick_config)
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts


@triton.jit
def w4a16_grouped_gemv_kernel(x_ptr, ids_ptr, q_ptr, s_ptr, m_ptr, y_ptr, N, K,
                              X_PER_ROUTE: tl.constexpr, GROUP: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                              HAS_MINS: tl.constexpr, GPU_ORDER: tl.constexpr):
    route = tl.program_id(0)
    expert = tl.load(ids_ptr + route).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    x_row = x_ptr + route * K if X_PER_ROUTE else x_ptr
    first = expert * N  # weight row 0 of this expert
    acc = int4_dot(x_row, q_ptr + first * (K // GROUP) * (GROUP // 8), s_ptr + first * (K // GROUP),
                   m_ptr + first * (K // GROUP), offs_n, n_mask, K // GROUP, GROUP, BLOCK_N,
                   BLOCK_G, HAS_MINS, GPU_ORDER)
    tl.store(y_ptr + route * N + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


def route_inputs(x, experts: PackedInt4Experts, expert_ids, what: str):
    """Checks shared by the routed launchers -> (x fp32 [1 or R, K], ids int64 [R])."""
    check_packed(experts, what)
    _, _, k = experts.shape
    device = experts.qweight.device
    x = as_rows(x, k, device, what)
    if expert_ids.dim() != 1 or expert_ids.numel() == 0 or expert_ids.is_floating_point():
        raise ValueError(f"{what}: expert_ids must be a non-empty 1-D integer tensor, got "
                         f"{expert_ids.dtype} {list(expert_ids.shape)}")
    routes = expert_ids.numel()
    if x.shape[0] not in (1, routes):
        raise ValueError(f"x must be [1, {k}] or [{routes}, {k}], got {list(x.shape)}")
    if expert_ids.device != device:
        raise registry.KernelError(f"{what}: expert_ids on {expert_ids.device}, weights on {device}")
    # Range is the router's contract; checked here only where it costs no device sync.
    if device.type == "cpu":
        lo, hi = int(expert_ids.min()), int(expert_ids.max())
        if lo < 0 or hi >= experts.num_experts:
            raise ValueError(f"expert ids must lie in 0..{experts.num_experts - 1}, got {lo}..{hi}")
    return x, expert_ids.to(torch.int64).contiguous()


def launch_routed(kernel, what: str, x, stacks: list[PackedInt4Experts], expert_ids,
                  out) -> torch.Tensor:
    """The launcher the routed kernels share: kernel(x, ids, q, s, m of each stack, out, N, K,
    X_PER_ROUTE, GROUP, BLOCK_N, BLOCK_G, HAS_MINS, GPU_ORDER), one program per (route, BLOCK_N
    outputs);
    the stacks share one shape and layout; q is passed as its int32 code words."""
    for stack in stacks[1:]:
        if stack.shape != stacks[0].shape or stack.group_size != stacks[0].group_size \
                or stack.symmetric != stacks[0].symmetric or stack.gpu_order != stacks[0].gpu_order:
            raise ValueError(f"{what}: stacks {[s.shape for s in stacks]} differ")
    x, ids = route_inputs(x, stacks[0], expert_ids, what)
    for stack in stacks[1:]:
        check_packed(stack, what)
    _, n, k = stacks[0].shape
    routes = ids.numel()
    out = out_buffer(out, (routes, n), stacks[0].qweight.device, what)
    cfg = pick_config(n, k, stacks[0].group_size, routes)
    grid = (routes, triton.cdiv(n, cfg["BLOCK_N"]))
    tensors = [t for s in stacks for t in (code_words(s), s.scales, mins_arg(s)[0])]
    kernel[grid](x, ids, *tensors, out, n, k, X_PER_ROUTE=x.shape[0] > 1,
                 GROUP=stacks[0].group_size, HAS_MINS=not stacks[0].symmetric,
                 GPU_ORDER=stacks[0].gpu_order, **cfg)
    return out


def w4a16_grouped_gemv(x: torch.Tensor, experts: PackedInt4Experts, expert_ids: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    return launch_routed(w4a16_grouped_gemv_kernel, "w4a16_grouped_gemv", x, [experts],
                         expert_ids, out)
