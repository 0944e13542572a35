"""moe_swiglu in Triton: gate and up rows of each selected expert in one program,
silu(gate) * up applied to the two accumulators before the only store.

Memory traffic per output element: 2 x (K/2 code bytes + 4*K/G bytes of scale and
min, 2*K/G when symmetric), read once; no [R, N] gate or up intermediates reach memory.
"""
import torch
import triton
import triton.language as tl

from engined.ops.w4a16_gemv.triton import int4_dot
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts
from engined.ops.w4a16_grouped_gemv.triton import launch_routed


@triton.jit
def moe_swiglu_kernel(x_ptr, ids_ptr, gq_ptr, gs_ptr, gm_ptr, uq_ptr, us_ptr, um_ptr, y_ptr,
                      N, K, X_PER_ROUTE: tl.constexpr, GROUP: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_MINS: tl.constexpr,
                      GPU_ORDER: tl.constexpr):
    route = tl.program_id(0)
    expert = tl.load(ids_ptr + route).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    x_row = x_ptr + route * K if X_PER_ROUTE else x_ptr
    first = expert * N
    qo, so, ng = first * (K // GROUP) * (GROUP // 8), first * (K // GROUP), K // GROUP
    gate = int4_dot(x_row, gq_ptr + qo, gs_ptr + so, gm_ptr + so, offs_n, n_mask, ng,
                    GROUP, BLOCK_N, BLOCK_G, HAS_MINS, GPU_ORDER)
    up = int4_dot(x_row, uq_ptr + qo, us_ptr + so, um_ptr + so, offs_n, n_mask, ng,
                  GROUP, BLOCK_N, BLOCK_G, HAS_MINS, GPU_ORDER)
    tl.store(y_ptr + route * N + offs_n, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty),
             mask=n_mask)


def moe_swiglu(x: torch.Tensor, gate: PackedInt4Experts, up: PackedInt4Experts,
               expert_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    if gate.shape != up.shape or gate.group_size != up.group_size \
            or gate.symmetric != up.symmetric or gate.gpu_order != up.gpu_order:
        raise ValueError(f"gate {gate.shape} and up {up.shape} stacks differ")
    return launch_routed(moe_swiglu_kernel, "moe_swiglu", x, [gate, up], expert_ids, out)
