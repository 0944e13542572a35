"""Plain fp32 reference for moe_decode, the routing rule it shares with every MoE path, and the
CPU's composed variant (the router's picks, then moe_grouped and the shared SwiGLU).

| tensor         | shape        | dtype                                                  |
|----------------|--------------|--------------------------------------------------------|
| f              | [B, D]       | any float: the post-attention-normed rows              |
| logits         | [B, E]       | fp32 router logits                                     |
| bias           | [E]          | e_score_correction_bias: chooses, never mixes          |
| w1, w3 / w2    | [E, I, D] / [E, D, I] | PackedInt4Experts, one group size and kind    |
| shared_gate_up | [2I, D]      | PackedInt4 (gate rows, then up rows), or None          |
| shared_down    | [D, I]       | PackedInt4, or None                                    |
| out            | [B, D]       | f's dtype: sum_k w_k expert_k(f) + shared(f)           |

Letters: b row, k choice, e expert, i expert width, d hidden.
"""
import torch
import torch.nn.functional as F

from engined.ops import int4_format, registry
from engined.ops.rowwise import rowwise


def route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, renormalize: bool, scaling: float):
    """logits: [T, E] fp32 -> (experts [T, k] int64, weights [T, k] fp32). The bias picks, the
    unbiased sigmoid scores mix (vLLM; reference §8.10)."""
    scores = torch.sigmoid(logits)
    experts = torch.topk(scores + bias.float(), top_k, dim=-1).indices
    weights = scores.gather(-1, experts)
    if renormalize and top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return experts, weights * scaling


def check_inputs(f, logits, w1, w3, w2, shared_gate_up, shared_down):
    e, inner, d = w1.shape
    if w3.shape != (e, inner, d) or w2.shape != (e, d, inner):
        raise ValueError(f"moe_decode: w1/w3 [E, I, D] and w2 [E, D, I] needed, got "
                         f"{w1.shape}, {w3.shape}, {w2.shape}")
    if f.dim() != 2 or f.shape[1] != d or logits.shape != (f.shape[0], e):
        raise ValueError(f"moe_decode: f [B, {d}] and logits [B, {e}] needed, got "
                         f"{list(f.shape)} and {list(logits.shape)}")
    if (shared_gate_up is None) != (shared_down is None):
        raise ValueError("moe_decode: the shared expert needs both gate_up and down")
    if shared_gate_up is not None and (shared_gate_up.shape != (2 * inner, d)
                                       or shared_down.shape != (d, inner)):
        raise ValueError(f"moe_decode: the shared expert must be [2*{inner}, {d}] and "
                         f"[{d}, {inner}], got {shared_gate_up.shape} and {shared_down.shape}")


@registry.register("moe_decode", registry.REFERENCE,
                   description="route, then each row's k experts and the shared one, in fp32")
def moe_decode(f, logits, bias, top_k: int, renormalize: bool, scaling: float, w1, w3, w2,
               shared_gate_up=None, shared_down=None, out=None) -> torch.Tensor:
    check_inputs(f, logits, w1, w3, w2, shared_gate_up, shared_down)
    experts, weights = route(logits.float(), bias, top_k, renormalize, scaling)
    x = f.float()
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)   # [B, D]
    for b in range(x.shape[0]):
        for e, w in zip(experts[b].tolist(), weights[b]):
            gate, up, down = (int4_format.dequantize(bank.expert(e)) for bank in (w1, w3, w2))
            y[b] += w * ((F.silu(x[b] @ gate.t()) * (x[b] @ up.t())) @ down.t())
    if shared_gate_up is not None:
        gate, up = (x @ int4_format.dequantize(shared_gate_up).t()).chunk(2, dim=-1)
        y += (F.silu(gate) * up) @ int4_format.dequantize(shared_down).t()
    y = y.to(f.dtype)
    return y if out is None else out.copy_(y)


@registry.register("moe_decode", "composed", devices=("cpu",),
                   description="route, the CPU's moe_grouped, then the shared SwiGLU's GEMVs")
def composed(f, logits, bias, top_k: int, renormalize: bool, scaling: float, w1, w3, w2,
             shared_gate_up=None, shared_down=None, out=None) -> torch.Tensor:
    check_inputs(f, logits, w1, w3, w2, shared_gate_up, shared_down)
    experts, weights = rowwise(route, logits.float(), bias, top_k, renormalize, scaling)
    y = registry.resolve("moe_grouped", "cpu").fn(f, w1, w3, w2, experts, weights)   # fp32
    if shared_gate_up is not None:                # summed in fp32, rounded once (as on the GPU)
        if shared_gate_up.tiles:                  # the CPU's tiles: as SwiGLU runs them
            gate, up = _gemv(shared_gate_up)(f.float(), shared_gate_up).chunk(2, dim=-1)
            h = F.silu(gate).mul_(up)
        else:
            h = registry.resolve("w4a16_swiglu", "cpu").fn(f.float(), shared_gate_up)
        y += _gemv(shared_down)(h, shared_down)
    y = y.to(f.dtype)
    return y if out is None else out.copy_(y)


def _gemv(w: int4_format.PackedInt4):
    """The CPU op of one INT4 linear: w4a16_tiles in the CPU's tiles, else w4a16_gemv."""
    return registry.resolve("w4a16_tiles" if w.tiles else "w4a16_gemv", "cpu").fn
