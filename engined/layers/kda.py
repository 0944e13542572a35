"""Kimi Delta Attention (reference §2.2): short conv, L2-normed q/k, softplus decay, delta rule.

Two paths over the same state: `chunked_kda` (prefill, WY/UT chunk form, one Python step per
chunk of CHUNK tokens, none per token) and `recurrent_kda_step` (decode, one token).
State per sequence: conv windows [3, C, W-1] (last W-1 pre-conv q/k/v inputs) and S [H, K, V] fp32.
"""
import functools
import glob
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engined.layers.linear import Linear, run_split
from engined.layers.rmsnorm import GatedRMSNorm
from engined.ops import registry

CHUNK = 64
SUB = 16                     # secondary chunk: pair decays only inside SUB x SUB blocks
DECAY_BLOCK_BYTES = 1 << 20  # the least budget for pair decays built at once (prefill transients)
L2_EPS = 1e-6


@dataclass
class KDAState:
    conv: torch.Tensor   # [3, C, W-1] pre-conv inputs of q, k, v (act dtype)
    S: torch.Tensor      # [H, K, V] fp32


def short_conv(x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Causal depthwise conv + SiLU, fp32 accumulate. Updates `window` in place.

    x: [T, C]; weight: [C, 1, W]; window: [C, W-1] (the inputs before x) -> [T, C] in x.dtype
    """
    t, w = x.shape[0], weight.shape[-1]
    xx = torch.cat((window.float(), x.float().t()), dim=1)  # [C, W-1+T]
    taps = xx.unfold(1, w, 1)                                # [C, T, W]: inputs t-W+1..t
    y = torch.einsum("ctw,cw->tc", taps, weight[:, 0].float())
    window.copy_(xx[:, t:t + w - 1] if w > 1 else window)
    return F.silu(y).to(x.dtype)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    # x: [..., K] fp32
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def kda_gate(r: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """g = -exp(A_log[h]) * softplus(r + dt_bias) (log-decay, <= 0). r: [T, H, K] -> fp32 [T, H, K]."""
    h = r.shape[-2]
    return -A_log.float().view(h, 1).exp() * F.softplus(r.float() + dt_bias.float().view(h, -1))


def recurrent_kda_step(q, k, v, g, beta, S, scale: float) -> torch.Tensor:
    """One token. q, k, g: [H, K]; v: [H, V]; beta: [H]; S: [H, K, V] fp32 updated in place -> o [H, V]."""
    S.mul_(g.exp().unsqueeze(-1))
    pred = torch.einsum("hk,hkv->hv", k, S)                     # h: head, k: key dim, v: value dim
    S.add_(torch.einsum("hk,hv->hkv", beta.unsqueeze(-1) * k, v - pred))
    return torch.einsum("hk,hkv->hv", q * scale, S)


def _pair_decay(gam: torch.Tensor, strict: bool) -> torch.Tensor:
    """exp(Γ_i - Γ_j) for j < i (strict) or j <= i, else 0. gam: [H, C, K] -> [H, C, C, K]."""
    c = gam.shape[1]
    keep = torch.ones(c, c, dtype=torch.bool, device=gam.device).tril(-1 if strict else 0)
    diff = gam.unsqueeze(2) - gam.unsqueeze(1)                  # [H, i, j, K]
    return diff.masked_fill(~keep[None, :, :, None], float("-inf")).exp()


@functools.cache
def decay_block_bytes(device_type: str) -> int:
    """Bytes of pair decays built at once (the transient of `_decayed_scores`), from the device:
    on CUDA a 1/16 share of the memory free at first use (at most 256 MiB); on the CPU the
    last-level cache, since blocks that spill it measured slower (1 MiB: 1.0 s, 32 MiB: 5.8 s
    for a 256-token chunk at 48B head sizes on 2 EPYC cores), whatever the RAM allows."""
    if device_type == "cuda":
        return max(DECAY_BLOCK_BYTES, min(256 << 20, torch.cuda.mem_get_info()[0] // 16))
    return max(DECAY_BLOCK_BYTES, _cpu_cache_bytes())


def _cpu_cache_bytes() -> int:
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(index) as f:
            text = f.read().strip()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes, default=0)


def _diagonal_scores(a, b, gam, strict: bool) -> torch.Tensor:
    """The SUB x SUB diagonal blocks of the decayed scores, through pair decays, a block of
    heads at a time. a, b, gam: [H, n, SUB, K] -> [H, n, SUB, SUB]."""
    h, n, s, k = a.shape
    step = max(1, decay_block_bytes(a.device.type) // (n * s * s * k * a.element_size()))
    out = a.new_empty(h, n, s, s)
    for h0 in range(0, h, step):
        x = slice(h0, h0 + step)
        flat = lambda t: t[x].reshape(-1, s, k)  # noqa: E731  [h*n, SUB, K]
        out[x] = torch.einsum("bik,bjk,bijk->bij", flat(a), flat(b),
                              _pair_decay(flat(gam), strict)).view(-1, n, s, s)
    return out


def _decayed_scores(a, b, gam, strict: bool) -> torch.Tensor:
    """Σ_k a[h,i,k] b[h,j,k] exp(Γ_i - Γ_j)[k] for j < i (strict) or j <= i, else 0: [H, C, C].

    In SUB-token blocks (fla's secondary chunking): a diagonal block needs the pair decays
    [SUB, SUB, K] per block and head; below it, rows i of later blocks meet the columns j of
    block J through the block's last position r (j <= r < i), so the score is one matmul of
    a_i exp(Γ_i - Γ_r) by b_j exp(Γ_r - Γ_j), both exponents <= 0. The pair decays of a whole
    chunk would be [H, C, C, K]: 67 MB per chunk at 48B sizes (32 heads, C = 64, K = 128)."""
    h, c, k = a.shape
    pad = -c % SUB                                  # a last chunk's odd length: zero rows,
    if pad:                                         # Γ held at its last value (no exp overflow)
        a, b = (F.pad(t, (0, 0, 0, pad)) for t in (a, b))
        gam = torch.cat((gam, gam[:, -1:].expand(h, pad, k)), dim=1)
    n = a.shape[1] // SUB
    blocks = lambda t: t.view(h, n, SUB, k)  # noqa: E731
    diag = _diagonal_scores(blocks(a), blocks(b), blocks(gam), strict)     # [H, n, SUB, SUB]
    out = torch.zeros(h, n * SUB, n * SUB, dtype=a.dtype, device=a.device)
    for j in range(n):
        cols = slice(j * SUB, (j + 1) * SUB)
        out[:, cols, cols] = diag[:, j]
        if j + 1 < n:
            r = gam[:, (j + 1) * SUB - 1:(j + 1) * SUB]          # Γ_r: [H, 1, K]
            later = a[:, (j + 1) * SUB:] * (gam[:, (j + 1) * SUB:] - r).exp()
            out[:, (j + 1) * SUB:, cols] = later @ (b[:, cols] * (r - gam[:, cols]).exp()).transpose(1, 2)
    return out[:, :c, :c]


def _chunk(q, k, v, g, beta, S):
    """One chunk, all heads (reference §2.2 chunkwise form). q (scaled), k, g: [H, C, K];
    v: [H, C, V]; beta: [H, C]; S: [H, K, V] -> (o [H, C, V], S_next [H, K, V])."""
    c = q.shape[1]
    gam = g.cumsum(1)                                           # Γ: [H, C, K]
    L = _decayed_scores(k, k, gam, strict=True) * beta.unsqueeze(-1)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + L, torch.diag_embed(beta), upper=False,
                                       unitriangular=True)      # (I + L)^-1 Diag(β): [H, C, C]
    W = Tm @ (gam.exp() * k)                                    # [H, C, K]
    Vn = Tm @ v - W @ S                                         # [H, C, V]
    A = _decayed_scores(q, k, gam, strict=False)
    o = (q * gam.exp()) @ S + A @ Vn
    last = gam[:, -1:, :]                                       # [H, 1, K]
    S_next = last.transpose(1, 2).exp() * S + ((last - gam).exp() * k).transpose(1, 2) @ Vn
    return o, S_next


def chunked_kda(q, k, v, g, beta, S, scale: float, chunk: int = CHUNK) -> torch.Tensor:
    """Prefill. q, k, g: [T, H, K]; v: [T, H, V]; beta: [T, H]; S: [H, K, V] fp32 updated in
    place -> o [T, H, V] fp32. Equal to T recurrent steps."""
    q, k, v, g, beta = (x.float().transpose(0, 1) for x in (q * scale, k, v, g, beta))
    outs, state = [], S
    for c0 in range(0, q.shape[1], chunk):
        part = slice(c0, c0 + chunk)
        o, state = _chunk(q[:, part], k[:, part], v[:, part], g[:, part], beta[:, part], state)
        outs.append(o)
    S.copy_(state)
    return torch.cat(outs, dim=1).transpose(0, 1)


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
        t, h = a.shape[0], self.num_heads
        heads = lambda x: x.float().view(t, h, -1)  # noqa: E731  [T, H*K] -> [T, H, K]
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        q, k, v = (short_conv(p(a), w, state.conv[i])
                   for i, (p, w) in enumerate(zip((self.q_proj, self.k_proj, self.v_proj), convs)))
        q, k, v = l2norm(heads(q)), l2norm(heads(k)), heads(v)
        g = kda_gate(heads(self.f_b_proj(self.f_a_proj(a))), self.A_log, self.dt_bias)
        beta = torch.sigmoid(self.b_proj(a).float())            # [T, H]
        if t == 1:
            o = recurrent_kda_step(q[0], k[0], v[0], g[0], beta[0], state.S, self.scale)[None]
        else:
            o = chunked_kda(q, k, v, g, beta, state.S, self.scale)
        y = self.o_norm(o.to(a.dtype), heads(self.g_b_proj(self.g_a_proj(a))))
        return self.o_proj(y.reshape(t, -1).to(a.dtype))

    def decode_batch(self, a: torch.Tensor, conv: torch.Tensor, S: torch.Tensor,
                     slots: torch.Tensor) -> torch.Tensor:
        """One token for each of B sequences whose states are slots of a pool, updated in place
        by slot: conv windows conv [N, 3, C, W-1], states S [N, H, K, V] fp32, slots [B] int64.
        a: [B, D] -> [B, D]. Two GEMVs (q/k/v, then f_a/g_a/b), one kda_decode (the short conv,
        norms, gates, the recurrent step and the gated output norm) and o_proj."""
        f_b, g_b = self._up_weights(a.dtype)
        y = registry.resolve("kda_decode", a.device.type).fn(
            run_split(self.qkv, [self.q_proj, self.k_proj, self.v_proj], a),       # [B, 3W]
            run_split(self.low, [self.f_a_proj, self.g_a_proj, self.b_proj], a),   # [B, 2K+H]
            f_b, g_b, self.conv_w, conv, S, slots,
            self.A_log.view(-1), self.dt_bias, self.o_norm.weight, self.o_norm.eps,
            self.scale)                                                          # [B, H*V]
        return self.o_proj(y)

    def _up_weights(self, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """f_b and g_b as dense [W, K] (kda_decode reads them whole per head; an INT4 pair,
        plan "all", is dequantized once, 2 x W x K values)."""
        if self._up is None:
            self._up = tuple(p.weight if not p.is_int4 else p.dense_weight(dtype)
                             for p in (self.f_b_proj, self.g_b_proj))
        return self._up

