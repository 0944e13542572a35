"""Plain fp32 reference for kda_prefill: a KDA layer's prefill between its short convolutions
and its output norm, the whole prompt chunk from the sequence's state, the state updated in
place (reference §2.2: L2-normed q/k, softplus decay, sigmoid write strength, and the delta
rule in the chunkwise WY/UT form, CHUNK tokens a Python step).

| tensor    | shape        | dtype                                      |
|-----------|--------------|--------------------------------------------|
| q, k      | [T, H, K]    | any float: short-conv outputs, not normed  |
| v         | [T, H, V]    | any float                                  |
| r         | [T, H, K]    | any float: the decay's pre-activation      |
| b         | [T, H]       | any float: the write strength's logits     |
| A_log     | [H]          | fp32                                       |
| dt_bias   | [H * K]      | fp32                                       |
| S         | [H, K, V]    | fp32, the sequence's state, updated        |
| out       | [T, H, V]    | fp32 (a variant may return q's dtype)      |

`out` is contiguous in every variant: the Triton gated norm after it takes no strides.

g = -exp(A_log) softplus(r + dt_bias); beta = sigmoid(b); q, k <- x / sqrt(|x|^2 + 1e-6);
then T recurrent steps (S <- exp(g) S; S <- S + beta k (v - k S); o = scale q S) in chunks.
"""
import functools
import glob

import torch
import torch.nn.functional as F

from engined.ops import registry

CHUNK = 64
SUB = 16                     # secondary chunk: pair decays only inside SUB x SUB blocks
DECAY_BLOCK_BYTES = 1 << 20  # the least budget for pair decays built at once (prefill transients)
L2_EPS = 1e-6


def check_inputs(q, k, v, r, b, A_log, dt_bias, S):
    t, h, kd = q.shape
    if k.shape != q.shape or r.shape != q.shape or v.dim() != 3 or v.shape[:2] != (t, h) \
            or b.shape != (t, h):
        raise ValueError(f"kda_prefill: q, k, r [T, H, K], v [T, H, V], b [T, H] needed, got "
                         f"{list(q.shape)} {list(k.shape)} {list(r.shape)} {list(v.shape)} {list(b.shape)}")
    if A_log.shape != (h,) or dt_bias.shape != (h * kd,):
        raise ValueError(f"kda_prefill: A_log [{h}] and dt_bias [{h * kd}] needed, got "
                         f"{list(A_log.shape)} {list(dt_bias.shape)}")
    if S.shape != (h, kd, v.shape[2]) or S.dtype != torch.float32:
        raise ValueError(f"kda_prefill: S must be fp32 [{h}, {kd}, {v.shape[2]}], got "
                         f"{S.dtype} {list(S.shape)}")


@registry.register("kda_prefill", registry.REFERENCE,
                   description="torch: norms and gates, then the chunk form a chunk at a time")
def kda_prefill(q, k, v, r, b, A_log, dt_bias, S, scale: float, out=None) -> torch.Tensor:
    check_inputs(q, k, v, r, b, A_log, dt_bias, S)
    g = kda_gate(r, A_log, dt_bias)
    o = chunked_kda(l2norm(q.float()), l2norm(k.float()), v, g, torch.sigmoid(b.float()), S, scale)
    return o.contiguous() if out is None else out.copy_(o)  # the chunk form's is [H, T, V] transposed


def l2norm(x: torch.Tensor) -> torch.Tensor:
    # x: [..., K] fp32
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def kda_gate(r: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """g = -exp(A_log[h]) * softplus(r + dt_bias) (log-decay, <= 0). r: [T, H, K] -> fp32 [T, H, K]."""
    h = r.shape[-2]
    return -A_log.float().view(h, 1).exp() * F.softplus(r.float() + dt_bias.float().view(h, -1))


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
