"""The routes of a multi-row MoE, sorted by expert, and the weighted sum back per token.

Letters: t token, k choice, r route (t*k of them), e expert, d hidden.
`sort_routes` runs on the device without a host sync (a CUDA graph can hold it): offsets
cover every expert, empty ones included. `combine` sums each token's k outputs in choice
order, so a token's result does not depend on the tokens batched with it.
"""
from dataclasses import dataclass

import torch

from engined.ops import registry


@dataclass(frozen=True)
class SortedRoutes:
    token: torch.Tensor     # [R] int64: the token of each route, routes in expert order
    route: torch.Tensor     # [R] int64: its flat index t * k + choice
    offsets: torch.Tensor   # [E + 1] int64: routes offsets[e]..offsets[e+1]-1 chose expert e


def sort_routes(experts: torch.Tensor, num_experts: int) -> SortedRoutes:
    """experts: [T, k] integer expert ids -> the routes grouped by expert (stable)."""
    flat = experts.reshape(-1).to(torch.int64)                             # [R]
    route = torch.argsort(flat, stable=True)                               # [R]
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))                    # [E] (bincount syncs)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return SortedRoutes(route // experts.shape[1], route, offsets)


def combine(y: torch.Tensor, routes: SortedRoutes, weights: torch.Tensor,
            out: torch.Tensor | None) -> torch.Tensor:
    """y: [R, D] expert outputs in route order; weights: [T, k] -> out [T, D] fp32,
    out[t] = sum over k (in choice order) of weights[t, k] * y of route (t, k)."""
    t, k = weights.shape
    by_choice = torch.empty(t * k, y.shape[1], dtype=torch.float32, device=y.device)
    by_choice[routes.route] = y.float()
    summed = (weights.float().unsqueeze(-1) * by_choice.view(t, k, -1)).sum(1)  # [T, D]
    return summed if out is None else out.copy_(summed)


def check_inputs(x: torch.Tensor, w1, w3, w2, experts: torch.Tensor, weights: torch.Tensor):
    """x: [T, D]; w1, w3: [E, I, D]; w2: [E, D, I], one group size and kind; experts,
    weights: [T, k]. Raises ValueError naming what is wrong."""
    e, inner, d = w1.shape
    if w3.shape != (e, inner, d) or w2.shape != (e, d, inner):
        raise ValueError(f"moe_grouped: w1/w3 [E, I, D] and w2 [E, D, I] needed, got "
                         f"{w1.shape}, {w3.shape}, {w2.shape}")
    if len({w.group_size for w in (w1, w3, w2)}) != 1 or len({w.symmetric for w in (w1, w3, w2)}) != 1:
        raise ValueError("moe_grouped: w1, w3 and w2 must share one group size and kind")
    if x.dim() != 2 or x.shape[1] != d or x.shape[0] < 1:
        raise ValueError(f"moe_grouped: x must be [T, {d}], got {list(x.shape)}")
    if experts.shape != weights.shape or experts.dim() != 2 or experts.shape[0] != x.shape[0] \
            or experts.is_floating_point():
        raise ValueError(f"moe_grouped: experts (integer) and weights must both be [{x.shape[0]}, k], "
                         f"got {experts.dtype} {list(experts.shape)} and {list(weights.shape)}")
    # the router's contract, checked where it costs no sync: on the CPU, and not on CPU tensors
    # standing in for a GPU's (the kernel counter counts what a GPU launches)
    if registry.runs_as(experts.device.type) == "cpu":
        lo, hi = int(experts.min()), int(experts.max())
        if lo < 0 or hi >= e:
            raise ValueError(f"moe_grouped: expert ids must lie in 0..{e - 1}, got {lo}..{hi}")
