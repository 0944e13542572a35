"""Plain fp32 reference for kda_step: one recurrent KDA step for B sequences whose states live
in slots of a pool, each updated in place (reference §2.2, delta rule with per-key decay).

| tensor   | shape          | dtype                                  |
|----------|----------------|----------------------------------------|
| q, k, g  | [B, H, K]      | fp32 (q, k L2-normed; g log-decay <= 0)|
| v        | [B, H, V]      | fp32                                   |
| beta     | [B, H]         | fp32                                   |
| states   | [N, H, K, V]   | fp32, N slots; rows `slots` updated    |
| slots    | [B]            | int64, distinct, 0..N-1                |
| out      | [B, H, V]      | fp32                                   |

Per row b, with S = states[slots[b]]: S <- exp(g) * S; S <- S + beta k (v - k S); o = scale q S.
"""
import torch

from engined.ops import registry


def check_inputs(q, k, v, g, beta, states, slots):
    b, h, kd = q.shape
    if k.shape != q.shape or g.shape != q.shape or v.dim() != 3 or v.shape[:2] != (b, h) \
            or beta.shape != (b, h):
        raise ValueError(f"kda_step: q, k, g [B, H, K], v [B, H, V], beta [B, H] needed, got "
                         f"{list(q.shape)} {list(k.shape)} {list(g.shape)} {list(v.shape)} {list(beta.shape)}")
    if states.dim() != 4 or states.shape[1:] != (h, kd, v.shape[2]) or states.dtype != torch.float32:
        raise ValueError(f"kda_step: states must be fp32 [N, {h}, {kd}, {v.shape[2]}], got "
                         f"{states.dtype} {list(states.shape)}")
    if slots.shape != (b,) or slots.is_floating_point():
        raise ValueError(f"kda_step: slots must be [{b}] integers, got {slots.dtype} {list(slots.shape)}")


@registry.register("kda_step", registry.REFERENCE,
                   description="per row: decay, delta update and readout on its slot's state view")
def kda_step(q, k, v, g, beta, states, slots, scale: float, out=None) -> torch.Tensor:
    check_inputs(q, k, v, g, beta, states, slots)
    rows = []
    for b, slot in enumerate(slots.tolist()):
        S = states[slot]                                           # [H, K, V], a view: in place
        S.mul_(g[b].float().exp().unsqueeze(-1))
        pred = torch.einsum("hk,hkv->hv", k[b].float(), S)         # h head, k key dim, v value dim
        S.add_(torch.einsum("hk,hv->hkv", beta[b].float().unsqueeze(-1) * k[b].float(), v[b].float() - pred))
        rows.append(torch.einsum("hk,hkv->hv", q[b].float() * scale, S))
    o = torch.stack(rows)                                          # [B, H, V]
    return o if out is None else out.copy_(o)
