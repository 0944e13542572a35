"""Plain reference for kda_decode: what KDA.decode_batch computes from its projections to
the o_proj input, for B sequences whose conv windows and states are slots of per-layer pools.
It is the CPU decode: no per-row loop, and the recurrent step is the device's kda_step variant
(cpu_batched on the CPU), as in the KDA.decode_batch it replaces.

| tensor   | shape          | dtype                                                  |
|----------|----------------|--------------------------------------------------------|
| qkv      | [B, 3W]        | act: q, k, v projections before the short conv, W = H*K |
| low      | [B, 2K + H]    | act: [f_a_proj(a) (K) , g_a_proj(a) (K) , b_proj(a) (H)] |
| f_b, g_b | [W, K]         | dense, act or weight dtype                              |
| conv_w   | [3, W, C]      | q, k, v depthwise conv weights, C taps                  |
| conv     | [N, 3, W, C-1] | act, N slots; rows `slots` updated (the last C-1 inputs)|
| S        | [N, H, K, V]   | fp32, N slots; rows `slots` updated; V == K             |
| slots    | [B]            | int64, distinct, 0..N-1                                 |
| A_log    | [H]            | fp32                                                    |
| dt_bias  | [W]            | fp32                                                    |
| o_norm_w | [V]            | any float                                               |
| out      | [B, W]         | qkv's dtype                                             |
| source   | [B] or None    | int64: the slots the rows' states start from (None: slots)|

Per row b, head h: q, k, v = SiLU(conv(window, x)); q, k = l2norm(q), l2norm(k);
g = -exp(A_log) softplus(f_b f_a + dt_bias); beta = sigmoid(b); the delta-rule step of
kda_step on S[slots[b], h]; y = RMS_eps(o) * o_norm_w * sigmoid(g_b g_a).
"""
import torch
import torch.nn.functional as F

from engined.layers.rmsnorm import GatedRMSNorm  # imports only torch
from engined.ops import registry


def check_inputs(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w):
    """-> (B, H, K, C). Shapes and dtypes only: nothing here reads a tensor's values."""
    b, h, kd = qkv.shape[0], A_log.shape[0], S.shape[-1]
    w, c = h * kd, conv_w.shape[-1]
    if qkv.dim() != 2 or qkv.shape[1] != 3 * w:
        raise ValueError(f"kda_decode: qkv must be [B, 3*{h}*{kd}], got {list(qkv.shape)}")
    if low.shape != (b, 2 * kd + h):
        raise ValueError(f"kda_decode: low must be [{b}, {2 * kd + h}] (f_a, g_a, b), got {list(low.shape)}")
    if f_b.shape != (w, kd) or g_b.shape != (w, kd):
        raise ValueError(f"kda_decode: f_b, g_b must be [{w}, {kd}], got {list(f_b.shape)} {list(g_b.shape)}")
    if conv_w.shape != (3, w, c) or conv.dim() != 4 or conv.shape[1:] != (3, w, c - 1):
        raise ValueError(f"kda_decode: conv_w [3, {w}, C] and conv [N, 3, {w}, C-1] needed, got "
                         f"{list(conv_w.shape)} {list(conv.shape)}")
    if S.dim() != 4 or S.shape[1:] != (h, kd, kd) or S.dtype != torch.float32 or S.shape[0] != conv.shape[0]:
        raise ValueError(f"kda_decode: S must be fp32 [{conv.shape[0]}, {h}, {kd}, {kd}] (one slot per "
                         f"conv slot, V == K), got {S.dtype} {list(S.shape)}")
    if slots.shape != (b,) or slots.is_floating_point():
        raise ValueError(f"kda_decode: slots must be [{b}] integers, got {slots.dtype} {list(slots.shape)}")
    if dt_bias.shape != (w,) or o_norm_w.shape != (kd,):
        raise ValueError(f"kda_decode: dt_bias [{w}] and o_norm_w [{kd}] needed, got "
                         f"{list(dt_bias.shape)} {list(o_norm_w.shape)}")
    return b, h, kd, c


def copy_source(conv, S, slots, source):
    """source [B] (None: nothing): each row's state starts from that slot's, copied to its own."""
    if source is not None:
        conv.index_copy_(0, slots, conv.index_select(0, source))
        S.index_copy_(0, slots, S.index_select(0, source))


@registry.register("kda_decode", registry.REFERENCE,
                   description="torch: the pools' rows gathered by slot, batched ops, written back")
def kda_decode(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w,
               eps: float, scale: float, out=None, source=None) -> torch.Tensor:
    # layers/kda imports engined.ops (through Linear): imported here, a module import would cycle
    from engined.layers.kda import kda_gate, l2norm
    b, h, kd, _ = check_inputs(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w)
    copy_source(conv, S, slots, source)
    heads = lambda x: x.float().view(b, h, -1)  # noqa: E731  [B, H*K] -> [B, H, K]
    taps = torch.cat((conv.index_select(0, slots).float(), qkv.float().view(b, 3, -1, 1)), -1)  # [B, 3, W, C]
    conv.index_copy_(0, slots, taps[..., 1:].to(conv.dtype).contiguous())  # (a strided source: 2x)
    conv_out = torch.einsum("bjwc,jwc->bjw", taps, conv_w.float())  # j: q/k/v, w: channel, c: tap
    q, k, v = F.silu(conv_out).to(qkv.dtype).unbind(1)
    q, k, v = l2norm(heads(q)), l2norm(heads(k)), heads(v)
    f_a, g_a, b_low = low.split((kd, kd, h), dim=1)
    g = kda_gate(heads(F.linear(f_a, f_b.to(low.dtype))), A_log, dt_bias)
    beta = torch.sigmoid(b_low.float())                          # [B, H]
    o = registry.resolve("kda_step", qkv.device.type).fn(q, k, v, g, beta, S, slots, scale)
    norm = GatedRMSNorm(kd, eps, o_norm_w.dtype, o_norm_w.device)
    norm.weight = o_norm_w
    y = norm(o.to(qkv.dtype), heads(F.linear(g_a, g_b.to(low.dtype)))).reshape(b, -1).to(qkv.dtype)
    return y if out is None else out.copy_(y)
