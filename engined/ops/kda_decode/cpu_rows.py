"""kda_decode on the CPU, a row at a time: each row runs the reference alone, so a row's
result is the same in any batch (ops/rowwise.py says why; its products, the state step and the norms
all see one row, as in a lone step). A row's step is a few dozen small torch calls; the
state it reads and writes is the same either way."""
import torch

from engined.ops import registry
from engined.ops.kda_decode import reference


@registry.register("kda_decode", "cpu_rows", devices=("cpu",),
                   description="torch: the reference on each row alone (row-exact in any batch)")
def kda_decode(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w,
               eps: float, scale: float, out=None, source=None) -> torch.Tensor:
    reference.check_inputs(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w)
    reference.copy_source(conv, S, slots, source)
    y = torch.cat([reference.kda_decode(qkv[b:b + 1], low[b:b + 1], f_b, g_b, conv_w, conv, S,
                                        slots[b:b + 1], A_log, dt_bias, o_norm_w, eps, scale)
                   for b in range(qkv.shape[0])])                         # [B, W]
    return y if out is None else out.copy_(y)
