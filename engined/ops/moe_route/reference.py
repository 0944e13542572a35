"""Plain reference for moe_route: moe_decode.reference.route, the routing rule every MoE path
shares (the bias picks, the unbiased sigmoid scores mix; reference §8.10).

| tensor  | shape  | dtype                                                     |
|---------|--------|-----------------------------------------------------------|
| logits  | [T, E] | fp32 router logits                                        |
| bias    | [E]    | any float: e_score_correction_bias                        |
| experts | [T, k] | int64, written in place: row t's picks, best first        |
| out     | [T, k] | fp32: their weights (renormalized when asked), * scaling  |
"""
import torch

from engined.ops import registry
from engined.ops.moe_decode.reference import route


def check_inputs(logits: torch.Tensor, bias: torch.Tensor, top_k: int, experts: torch.Tensor):
    t, e = logits.shape if logits.dim() == 2 else (-1, -1)
    if t < 0 or logits.dtype != torch.float32 or bias.shape != (e,) or not 0 < top_k <= e:
        raise ValueError(f"moe_route: fp32 logits [T, E], bias [E] and 0 < top_k <= E needed, got "
                         f"{logits.dtype} {list(logits.shape)}, {list(bias.shape)} and {top_k}")
    if experts.shape != (t, top_k) or experts.dtype != torch.int64:
        raise ValueError(f"moe_route: experts must be int64 [{t}, {top_k}], got {experts.dtype} "
                         f"{list(experts.shape)}")


@registry.register("moe_route", registry.REFERENCE,
                   description="sigmoid, topk of the biased scores, gather, renormalize")
def moe_route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, renormalize: bool,
              scaling: float, experts: torch.Tensor, out: torch.Tensor | None = None
              ) -> torch.Tensor:
    check_inputs(logits, bias, top_k, experts)
    picks, weights = route(logits, bias, top_k, renormalize, scaling)
    experts.copy_(picks)
    return weights if out is None else out.copy_(weights)
