"""moe_grouped in Triton: one program per (expert, BLOCK_N outputs), looping over the rows
that chose the expert. Offsets cover every expert, so the grid is fixed ([E, N/BLOCK_N]) and
nothing syncs with the host: a CUDA graph can hold the whole op. An expert nobody chose
exits at once.

Memory traffic per output element: K/2 code bytes + 2*K/G (symmetric) or 4*K/G bytes of
scale and min of each chosen expert, read from memory once; a program's later rows find
the same tile in cache. Two launches: gate/up with the SwiGLU epilogue into h [R, I], then
down into y [R, D]; the weighted sum per token is routes.combine.
"""
import torch
import triton
import triton.language as tl

from engined.ops.moe_grouped.routes import check_inputs, combine, sort_routes
from engined.ops.w4a16_gemv.triton import check_packed, code_words, int4_dot, mins_arg, pick_config


@triton.jit
def moe_grouped_kernel(x_ptr, token_ptr, offsets_ptr, aq_ptr, as_ptr, am_ptr, bq_ptr, bs_ptr,
                       bm_ptr, y_ptr, N, K, GATHER: tl.constexpr, SWIGLU: tl.constexpr,
                       GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                       HAS_MINS: tl.constexpr, GPU_ORDER: tl.constexpr):
    expert = tl.program_id(0).to(tl.int64)
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    first = expert * N                       # weight row 0 of this expert
    qo, so, ng = first * (K // GROUP) * (GROUP // 8), first * (K // GROUP), K // GROUP
    for r in range(start, end):
        src = tl.load(token_ptr + r) if GATHER else r
        x_row = x_ptr + src * K
        acc = int4_dot(x_row, aq_ptr + qo, as_ptr + so, am_ptr + so, offs_n, n_mask, ng,
                       GROUP, BLOCK_N, BLOCK_G, HAS_MINS, GPU_ORDER)
        if SWIGLU:
            up = int4_dot(x_row, bq_ptr + qo, bs_ptr + so, bm_ptr + so, offs_n, n_mask, ng,
                          GROUP, BLOCK_N, BLOCK_G, HAS_MINS, GPU_ORDER)
            acc = acc * tl.sigmoid(acc) * up
        tl.store(y_ptr + r * N + offs_n, acc, mask=n_mask)


def _launch(x, token, offsets, a, b, out_rows: int, gather: bool):
    num_experts, n, k = a.shape
    y = torch.empty((out_rows, n), dtype=torch.float32, device=x.device)
    cfg = pick_config(n, k, a.group_size, num_experts)
    am, has_mins = mins_arg(a)
    b = b or a                               # down: one stack, b unread (SWIGLU false)
    moe_grouped_kernel[(num_experts, triton.cdiv(n, cfg["BLOCK_N"]))](
        x, token, offsets, code_words(a), a.scales, am, code_words(b), b.scales, mins_arg(b)[0], y,
        n, k, GATHER=gather, SWIGLU=b is not a, GROUP=a.group_size, HAS_MINS=has_mins,
        GPU_ORDER=a.gpu_order, **cfg)
    return y


def check_triton_inputs(x, w1, w3, w2, experts, weights):
    """check_inputs, and the three stacks packed as the Triton kernels read them, in one
    code order (this variant and triton_dot.py)."""
    check_inputs(x, w1, w3, w2, experts, weights)
    for w in (w1, w3, w2):
        check_packed(w, "moe_grouped")
    if len({w.gpu_order for w in (w1, w3, w2)}) != 1:
        raise ValueError("moe_grouped: w1, w3 and w2 must share one code order")


def moe_grouped(x, w1, w3, w2, experts, weights, out=None) -> torch.Tensor:
    check_triton_inputs(x, w1, w3, w2, experts, weights)
    x = x.to(torch.float32).contiguous()
    routes = sort_routes(experts, w1.num_experts)
    r = routes.token.numel()
    h = _launch(x, routes.token, routes.offsets, w1, w3, r, gather=True)       # [R, I]
    y = _launch(h, routes.token, routes.offsets, w2, None, r, gather=False)    # [R, D]
    return combine(y, routes, weights, out)
