"""moe_route in Triton: one program per row runs moe_decode's top_k_routes (sigmoid, + bias,
top-k by k passes of argmax over the E scores, the unbiased scores renormalized and scaled) and
stores the row's picks and weights. One launch in place of the nine of the eager rule (sigmoid,
cast, add, topk, gather, sum, add, div, mul). Memory traffic per row: E fp32 logits read, k
picks and weights written; the bias from cache.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.moe_decode.triton import top_k_routes
from engined.ops.moe_route.reference import check_inputs
from engined.ops.w4a16_gemv.triton import out_buffer


@triton.jit
def moe_route_kernel(logits_ptr, bias_ptr, experts_ptr, weights_ptr, E, scaling,
                     TOP_K: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    experts, weights = top_k_routes(logits_ptr + row * E, bias_ptr, E, scaling, TOP_K, RENORM,
                                    BLOCK_E, BLOCK_K)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < TOP_K
    tl.store(experts_ptr + row * TOP_K + offs, experts.to(tl.int64), mask=mask)
    tl.store(weights_ptr + row * TOP_K + offs, weights, mask=mask)


def moe_route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, renormalize: bool,
              scaling: float, experts: torch.Tensor, out: torch.Tensor | None = None
              ) -> torch.Tensor:
    check_inputs(logits, bias, top_k, experts)
    t, e = logits.shape
    if not (logits.is_contiguous() and bias.is_contiguous() and experts.is_contiguous()):
        raise registry.KernelError("moe_route: logits, bias and experts must be contiguous")
    out = out_buffer(out, (t, top_k), logits.device, "moe_route")
    if t:
        moe_route_kernel[(t,)](logits, bias, experts, out, e, scaling, TOP_K=top_k,
                               RENORM=renormalize, BLOCK_E=triton.next_power_of_2(e),
                               BLOCK_K=triton.next_power_of_2(top_k), num_warps=4)
    return out
