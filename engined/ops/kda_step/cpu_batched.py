"""kda_step on the CPU, batched: the B states gathered once, every row's step in one set of
batched ops, the states written back by slot. The gather and write-back copy B states
(H*K*V*4 bytes each: 64 KiB for synthetic:small's layers), which on the CPU costs far less
than B rounds of small per-row ops."""
import torch

from engined.ops import registry
from engined.ops.kda_step.reference import check_inputs


@registry.register("kda_step", "cpu_batched", devices=("cpu",),
                   description="torch: gather the slots' states, one batched step, write back")
def kda_step(q, k, v, g, beta, states, slots, scale: float, out=None) -> torch.Tensor:
    check_inputs(q, k, v, g, beta, states, slots)
    slots = slots.to(torch.int64)
    S = states.index_select(0, slots)                              # [B, H, K, V]
    k = k.float()
    S.mul_(g.float().exp().unsqueeze(-1))
    pred = torch.einsum("bhk,bhkv->bhv", k, S)                     # b row, h head, k key, v value
    S.add_(torch.einsum("bhk,bhv->bhkv", beta.float().unsqueeze(-1) * k, v.float() - pred))
    o = torch.einsum("bhk,bhkv->bhv", q.float() * scale, S)
    states.index_copy_(0, slots, S)
    return o if out is None else out.copy_(o)


registry.set_default("kda_step", "cpu", "cpu_batched")
