"""moe_decode in Triton: the routed-MoE FFN of B decode rows in two launches, no host sync.

Every program recomputes its row's routing from the logits (sigmoid, + bias, top-k by k passes
of argmax over E values, the unbiased scores renormalized and scaled: a few hundred ALU ops
against the KiBs of weights it reads), so routing needs no launch of its own and nothing waits
on the host. Grids are sized by the routes, not by the E experts:
  1. gate/up: one program per (route, BLOCK_N expert outputs), B*(k+1) routes (the shared expert
     is route k of each row): h[route] = silu(x gate^T) * (x up^T), fp32 [B*(k+1), I];
  2. down: one program per (row, BLOCK_N hidden outputs), looping over the row's k routes in
     choice order and then the shared expert: y[b] = sum_k w_k h[b, k] down_k^T + h[b, k] sdown^T.
Memory traffic per row: each chosen expert's three matrices once, (K/2 + 2K/G) bytes a weight
row, plus the shared expert's; h is 4*(k+1)*I bytes, from L2.
"""
import torch
import triton
import triton.language as tl

from engined.ops.moe_decode.reference import check_inputs
from engined.ops.w4a16_gemv.triton import (as_rows, check_packed, code_words, int4_dot, mins_arg,
                                           pick_config)


@triton.jit
def top_k_routes(logit_row, bias_ptr, E, scaling, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                 BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """-> (experts [BLOCK_K] int32, weights [BLOCK_K] fp32): the row's k picks in order."""
    offs_e = tl.arange(0, BLOCK_E)
    e_mask = offs_e < E
    scores = tl.sigmoid(tl.load(logit_row + offs_e, mask=e_mask, other=0.0).to(tl.float32))
    bias = tl.load(bias_ptr + offs_e, mask=e_mask, other=0.0).to(tl.float32)
    choose = tl.where(e_mask, scores + bias, float("-inf"))
    offs_k = tl.arange(0, BLOCK_K)
    experts = tl.zeros([BLOCK_K], dtype=tl.int32)
    weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(choose, axis=0)
        experts = tl.where(offs_k == j, best, experts)
        weights = tl.where(offs_k == j, tl.sum(tl.where(offs_e == best, scores, 0.0), axis=0),
                           weights)
        choose = tl.where(offs_e == best, float("-inf"), choose)
    if RENORM and TOP_K > 1:
        weights = weights / (tl.sum(weights, axis=0) + 1e-20)
    return experts, weights * scaling


@triton.jit
def moe_gate_up_kernel(x_ptr, logits_ptr, bias_ptr, gq_ptr, gs_ptr, gm_ptr, uq_ptr, us_ptr, um_ptr,
                       sq_ptr, ss_ptr, sm_ptr, h_ptr, E, N, K, scaling,
                       TOP_K: tl.constexpr, RENORM: tl.constexpr, SHARED: tl.constexpr,
                       GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                       HAS_MINS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                       GPU_ORDER: tl.constexpr):
    route = tl.program_id(0)
    row, j = route // (TOP_K + SHARED), route % (TOP_K + SHARED)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    ng = K // GROUP
    if j < TOP_K:
        experts, _ = top_k_routes(logits_ptr + row * E, bias_ptr, E, scaling, TOP_K, RENORM,
                                  BLOCK_E, BLOCK_K)
        first = tl.sum(tl.where(tl.arange(0, BLOCK_K) == j, experts, 0), axis=0).to(tl.int64) * N
        words = first * ng * (GROUP // 8)    # whole rows of words: 16-byte aligned to the compiler
        gate_c, gate_s, gate_m = gq_ptr + words, gs_ptr + first * ng, gm_ptr + first * ng
        up_c, up_s, up_m = uq_ptr + words, us_ptr + first * ng, um_ptr + first * ng
    else:                                    # the shared expert: gate rows, then up rows
        gate_c, gate_s, gate_m = sq_ptr, ss_ptr, sm_ptr
        up_c, up_s, up_m = sq_ptr + N * ng * (GROUP // 8), ss_ptr + N * ng, sm_ptr + N * ng
    x_row = x_ptr + row.to(tl.int64) * K
    gate = int4_dot(x_row, gate_c, gate_s, gate_m, offs_n, n_mask, ng, GROUP, BLOCK_N, BLOCK_G,
                    HAS_MINS, GPU_ORDER)
    up = int4_dot(x_row, up_c, up_s, up_m, offs_n, n_mask, ng, GROUP, BLOCK_N, BLOCK_G, HAS_MINS,
                  GPU_ORDER)
    tl.store(h_ptr + route.to(tl.int64) * N + offs_n, gate * tl.sigmoid(gate) * up, mask=n_mask)


@triton.jit
def moe_down_kernel(h_ptr, logits_ptr, bias_ptr, dq_ptr, ds_ptr, dm_ptr, sq_ptr, ss_ptr, sm_ptr,
                    y_ptr, E, N, K, scaling, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                    SHARED: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_G: tl.constexpr, HAS_MINS: tl.constexpr, BLOCK_E: tl.constexpr,
                    BLOCK_K: tl.constexpr, GPU_ORDER: tl.constexpr):
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    ng = K // GROUP
    experts, weights = top_k_routes(logits_ptr + row * E, bias_ptr, E, scaling, TOP_K, RENORM,
                                    BLOCK_E, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    h_row = h_ptr + row.to(tl.int64) * (TOP_K + SHARED) * K
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(TOP_K):                   # choice order, as the reference sums
        first = tl.sum(tl.where(offs_k == j, experts, 0), axis=0).to(tl.int64) * N
        w = tl.sum(tl.where(offs_k == j, weights, 0.0), axis=0)
        acc += w * int4_dot(h_row + j * K, dq_ptr + first * ng * (GROUP // 8), ds_ptr + first * ng,
                            dm_ptr + first * ng, offs_n, n_mask, ng, GROUP, BLOCK_N, BLOCK_G,
                            HAS_MINS, GPU_ORDER)
    if SHARED:
        acc += int4_dot(h_row + TOP_K * K, sq_ptr, ss_ptr, sm_ptr, offs_n, n_mask, ng, GROUP,
                        BLOCK_N, BLOCK_G, HAS_MINS, GPU_ORDER)
    tl.store(y_ptr + row.to(tl.int64) * N + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


def _parts(w):
    """(code words, scales, mins or scales) of a packed linear or expert stack."""
    return code_words(w), w.scales, mins_arg(w)[0]


def moe_decode(f, logits, bias, top_k: int, renormalize: bool, scaling: float, w1, w3, w2,
               shared_gate_up=None, shared_down=None, out=None) -> torch.Tensor:
    check_inputs(f, logits, w1, w3, w2, shared_gate_up, shared_down)
    stacks = [w1, w3, w2] + ([shared_gate_up, shared_down] if shared_gate_up is not None else [])
    for w in stacks:
        check_packed(w, "moe_decode")
    if len({(w.group_size, w.symmetric, w.gpu_order) for w in stacks}) != 1:
        raise ValueError("moe_decode: every expert matrix must share one group size, kind and "
                         "code order")
    e, inner, d = w1.shape
    b = f.shape[0]
    x = as_rows(f, d, w1.qweight.device, "moe_decode")
    logits = logits.to(torch.float32).contiguous()
    shared = shared_gate_up is not None
    routes = b * (top_k + shared)
    meta = dict(TOP_K=top_k, RENORM=renormalize, SHARED=shared, GROUP=w1.group_size,
                HAS_MINS=not w1.symmetric, GPU_ORDER=w1.gpu_order, BLOCK_E=triton.next_power_of_2(e),
                BLOCK_K=triton.next_power_of_2(top_k))
    h = torch.empty((routes, inner), dtype=torch.float32, device=x.device)
    s_up = _parts(shared_gate_up) if shared else _parts(w1)          # unread without a shared
    cfg = pick_config(inner, d, w1.group_size)
    moe_gate_up_kernel[(routes, triton.cdiv(inner, cfg["BLOCK_N"]))](
        x, logits, bias, *_parts(w1), *_parts(w3), *s_up, h, e, inner, d, float(scaling),
        **meta, **cfg)
    y = torch.empty((b, d), dtype=f.dtype, device=x.device) if out is None else out
    s_down = _parts(shared_down) if shared else _parts(w2)
    cfg = pick_config(d, inner, w1.group_size)
    moe_down_kernel[(b, triton.cdiv(d, cfg["BLOCK_N"]))](
        h, logits, bias, *_parts(w2), *s_down, y, e, d, inner, float(scaling), **meta, **cfg)
    return y
