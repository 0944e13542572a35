"""kda_step in Triton: one program per (row, head, BLOCK_V value columns), reading and writing
its slot's state in place: no gather, no copy, no host sync, so a CUDA graph can hold it.

Memory traffic per row and head: the K x V fp32 state read once and written once (2 * 64 KiB
at K = V = 128), plus q, k, g (3K) and v (V); the state dominates.
"""
import torch
import triton
import triton.language as tl

from engined.ops import registry
from engined.ops.kda_step.reference import check_inputs


@triton.jit
def kda_step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, slots_ptr, o_ptr, scale,
                    H, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_V: tl.constexpr):
    row, head = tl.program_id(0), tl.program_id(1)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask, v_mask = offs_k < K, offs_v < V
    vec = (row * H + head) * K
    q = tl.load(q_ptr + vec + offs_k, mask=k_mask, other=0.0)
    k = tl.load(k_ptr + vec + offs_k, mask=k_mask, other=0.0)
    g = tl.load(g_ptr + vec + offs_k, mask=k_mask, other=0.0)
    v = tl.load(v_ptr + (row * H + head) * V + offs_v, mask=v_mask, other=0.0)
    beta = tl.load(beta_ptr + row * H + head)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    s_at = s_ptr + ((slot * H + head) * K + offs_k[:, None]) * V + offs_v[None, :]
    mask = k_mask[:, None] & v_mask[None, :]
    S = tl.load(s_at, mask=mask, other=0.0) * tl.exp(g)[:, None]   # [BLOCK_K, BLOCK_V]
    pred = tl.sum(k[:, None] * S, axis=0)                          # [BLOCK_V]
    S += (beta * k)[:, None] * (v - pred)[None, :]
    o = tl.sum((q * scale)[:, None] * S, axis=0)
    tl.store(s_at, S, mask=mask)
    tl.store(o_ptr + (row * H + head) * V + offs_v, o, mask=v_mask)


def kda_step(q, k, v, g, beta, states, slots, scale: float, out=None) -> torch.Tensor:
    check_inputs(q, k, v, g, beta, states, slots)
    if not states.is_contiguous():
        raise registry.KernelError("kda_step: the state pool must be contiguous")
    b, h, kd = q.shape
    vd = v.shape[2]
    q, k, v, g, beta = (t.to(torch.float32).contiguous() for t in (q, k, v, g, beta))
    slots = slots.to(torch.int64).contiguous()
    o = torch.empty((b, h, vd), dtype=torch.float32, device=q.device) if out is None else out
    block_k = triton.next_power_of_2(kd)
    block_v = min(triton.next_power_of_2(vd), max(16, 8192 // block_k))  # <= 8K fp32 per program
    kda_step_kernel[(b, h, triton.cdiv(vd, block_v))](
        q, k, v, g, beta, states, slots, o, scale, h, K=kd, V=vd, BLOCK_K=block_k, BLOCK_V=block_v)
    return o
