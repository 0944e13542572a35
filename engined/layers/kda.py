"""Kimi Delta Attention (reference §2.2): short conv, L2-normed q/k, softplus decay, delta rule.

Two paths over the same state: the op kda_prefill (prefill: fla's chunk_kda on CUDA, our WY/UT
chunk form `chunked_kda` elsewhere) and `recurrent_kda_step` (decode, one token).
State per sequence: conv windows [3, C, W-1] (last W-1 pre-conv q/k/v inputs) and S [H, K, V] fp32.
"""
from dataclasses import dataclass

import torch

from engined.layers.linear import Linear, run_split
from engined.layers.rmsnorm import GatedRMSNorm
from engined.ops import registry
from engined.ops.kda_prefill.reference import (  # noqa: F401  (the chunk form's names)
    CHUNK, DECAY_BLOCK_BYTES, L2_EPS, SUB, chunked_kda, decay_block_bytes, kda_gate, l2norm)
from engined.ops.short_conv.reference import short_conv  # noqa: F401  (the eager conv)


@dataclass
class KDAState:
    conv: torch.Tensor   # [3, C, W-1] pre-conv inputs of q, k, v (act dtype)
    S: torch.Tensor      # [H, K, V] fp32


def recurrent_kda_step(q, k, v, g, beta, S, scale: float) -> torch.Tensor:
    """One token. q, k, g: [H, K]; v: [H, V]; beta: [H]; S: [H, K, V] fp32 updated in place -> o [H, V]."""
    S.mul_(g.exp().unsqueeze(-1))
    pred = torch.einsum("hk,hkv->hv", k, S)                     # h: head, k: key dim, v: value dim
    S.add_(torch.einsum("hk,hv->hkv", beta.unsqueeze(-1) * k, v - pred))
    return torch.einsum("hk,hkv->hv", q * scale, S)


class KDA:
    """Per-layer weights and forward. Input a: [T, D] (already input-normed)."""

    def __init__(self, hidden: int, num_heads: int, head_dim: int, conv_size: int, eps: float,
                 dtype, device="cpu", int4: dict[str, int] | None = None):
        int4 = int4 or {}
        width, self.num_heads, self.head_dim = num_heads * head_dim, num_heads, head_dim
        proj = lambda name, n, k: Linear(n, k, dtype, device, int4.get(name))  # noqa: E731
        # projections of the same input are rows of one linear (one GEMV a step) when their
        # formats agree (every quantization plan): q/k/v, and the low-rank f_a/g_a with b
        self.qkv, (self.q_proj, self.k_proj, self.v_proj) = Linear.split(
            int4, ("q_proj", "k_proj", "v_proj"), (width,) * 3, hidden, dtype, device)
        self.conv_w = torch.empty(3, width, conv_size, dtype=dtype, device=device)  # q, k, v taps
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (w.unsqueeze(1) for w in self.conv_w)
        self.low, (self.f_a_proj, self.g_a_proj, self.b_proj) = Linear.split(
            int4, ("f_a_proj", "g_a_proj", "b_proj"), (head_dim, head_dim, num_heads), hidden,
            dtype, device)
        self.f_b_proj, self.g_b_proj = proj("f_b_proj", width, head_dim), proj("g_b_proj", width, head_dim)
        self._up: tuple[torch.Tensor, torch.Tensor] | None = None
        self.A_log = torch.empty(1, 1, num_heads, 1, dtype=torch.float32, device=device)
        self.dt_bias = torch.empty(width, dtype=torch.float32, device=device)
        self.o_norm = GatedRMSNorm(head_dim, eps, dtype, device)
        self.o_proj = proj("o_proj", hidden, width)
        self.scale = head_dim ** -0.5

    def new_state(self, act_dtype, device) -> KDAState:
        c, w = self.q_conv1d.shape[0], self.q_conv1d.shape[-1]
        return KDAState(torch.zeros(3, c, w - 1, dtype=act_dtype, device=device),
                        torch.zeros(self.num_heads, self.head_dim, self.head_dim,
                                    dtype=torch.float32, device=device))

    def __call__(self, a: torch.Tensor, state: KDAState) -> torch.Tensor:
        # a: [T, D] -> [T, D]
        t, h, width = a.shape[0], self.num_heads, self.conv_w.shape[1]
        heads = lambda x: x.view(t, h, -1)  # noqa: E731  [T, H*K] -> [T, H, K]
        # q/k/v: one GEMM and one depthwise conv over their W channels side by side
        qkv = run_split(self.qkv, [self.q_proj, self.k_proj, self.v_proj], a)      # [T, 3W]
        q, k, v = (heads(x) for x in registry.resolve("short_conv", a.device.type).fn(
            qkv, self.conv_w.view(3 * width, 1, -1), state.conv.view(3 * width, -1), 3))
        f_a, g_a, b = run_split(self.low, [self.f_a_proj, self.g_a_proj, self.b_proj], a).split(
            (self.head_dim, self.head_dim, h), dim=-1)                               # [T, K], [T, K], [T, H]
        r = heads(self.f_b_proj(f_a))                                                # [T, H, K]
        if t == 1:
            g, beta = kda_gate(r, self.A_log, self.dt_bias), torch.sigmoid(b.float())
            o = recurrent_kda_step(l2norm(q[0].float()), l2norm(k[0].float()), v[0].float(), g[0],
                                   beta[0], state.S, self.scale)[None]
        else:
            o = registry.resolve("kda_prefill", a.device.type).fn(
                q, k, v, r, b, self.A_log.view(-1), self.dt_bias, state.S, self.scale)
        y = registry.resolve("gated_rmsnorm", a.device.type).fn(
            o.to(a.dtype), heads(self.g_b_proj(g_a)), self.o_norm.weight, self.o_norm.eps)
        return self.o_proj(y.reshape(t, -1))                                         # y: a's dtype

    def decode_batch(self, a: torch.Tensor, conv: torch.Tensor, S: torch.Tensor,
                     slots: torch.Tensor, passes=None) -> torch.Tensor:
        """One token for each of B rows whose states are slots of a pool, updated in place
        by slot: conv windows conv [N, 3, C, W-1], states S [N, H, K, V] fp32, slots [B] int64.
        a: [B, D] -> [B, D]. Two GEMVs (q/k/v, then f_a/g_a/b), one kda_decode (the short conv,
        norms, gates, the recurrent step and the gated output norm) and o_proj.
        passes (kimi_cache.StatePass, a sequence's rows at consecutive positions): kda_decode
        once per pass, in order, each pass's states read from the slots before it."""
        f_b, g_b = self._up_weights(a.dtype)
        step = registry.resolve("kda_decode", a.device.type).fn
        qkv = run_split(self.qkv, [self.q_proj, self.k_proj, self.v_proj], a)       # [B, 3W]
        low = run_split(self.low, [self.f_a_proj, self.g_a_proj, self.b_proj], a)   # [B, 2K+H]
        run = lambda rows, at, source=None: step(  # noqa: E731  rows' qkv, low -> [n, H*V]
            *rows, f_b, g_b, self.conv_w, conv, S, at, self.A_log.view(-1), self.dt_bias,
            self.o_norm.weight, self.o_norm.eps, self.scale, source=source)
        if passes is None:
            return self.o_proj(run((qkv, low), slots))
        y = qkv.new_empty(a.shape[0], qkv.shape[1] // 3)                           # [B, H*V]
        for p in passes:
            y[p.rows] = run((qkv[p.rows], low[p.rows]), p.slots, p.source)
        return self.o_proj(y)

    def _up_weights(self, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """f_b and g_b as dense [W, K] (kda_decode reads them whole per head; an INT4 pair,
        plan "all", is dequantized once, 2 x W x K values)."""
        if self._up is None:
            self._up = tuple(p.weight if not p.is_int4 else p.dense_weight(dtype)
                             for p in (self.f_b_proj, self.g_b_proj))
        return self._up

