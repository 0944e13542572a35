"""Multi-head Latent Attention, NoPE (reference §2.4). The cache holds the compressed latent only:
per position [ĉ (normed latent, R) ; kr (P)], R = kv_lora_rank, P = qk_rope_head_dim.

Short calls (decode, small prefill chunks) absorb kv_b into the query and output; long prefill
chunks expand K/V from the cached latents. Batched decode reads each row's latents through its
block table (ops/paged_mla_decode).
Letters: t query, s key position, h head, r latent dim, n nope dim, p rope-slice dim, v value dim.
"""
import torch
import torch.nn.functional as F

from engined.layers.linear import Linear
from engined.layers.rmsnorm import RMSNorm
from engined.ops import registry
from engined.ops.rowwise import rowwise

LATENT_EPS = 1e-6  # kv_a_layernorm keeps the class default, not rms_norm_eps (§8.9)
# Absorbed attention costs ~T*(2R+P) per head and key, expanded ~R*(N+V) + T*(N+P+V): with the
# real shapes (R=512) absorbing is cheaper below T ~ 170 new tokens.
ABSORB_MAX_T = 128


class MLA:
    def __init__(self, hidden: int, num_heads: int, kv_lora_rank: int, nope_dim: int,
                 rope_dim: int, v_dim: int, dtype, device="cpu", int4: dict[str, int] | None = None):
        int4 = int4 or {}
        self.num_heads, self.rank, self.nope, self.rope, self.vdim = (
            num_heads, kv_lora_rank, nope_dim, rope_dim, v_dim)
        proj = lambda name, n, k: Linear(n, k, dtype, device, int4.get(name))  # noqa: E731
        self.q_proj = proj("q_proj", num_heads * (nope_dim + rope_dim), hidden)
        self.kv_a_proj_with_mqa = proj("kv_a_proj_with_mqa", kv_lora_rank + rope_dim, hidden)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, LATENT_EPS, dtype, device)
        self.kv_b_proj = proj("kv_b_proj", num_heads * (nope_dim + v_dim), kv_lora_rank)
        self.o_proj = proj("o_proj", hidden, num_heads * v_dim)
        self.scale = (nope_dim + rope_dim) ** -0.5
        self._uk_uv: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._decode_dtype: torch.dtype | None = None

    @property
    def absorbed_bytes(self) -> int:
        """Bytes of the W_UK/W_UV copies decode reads each step (0 before the first step)."""
        if self._decode_dtype is None:
            return 0
        return sum(t.nbytes for t in self._uk_uv[self._decode_dtype])

    @property
    def latent_width(self) -> int:
        return self.rank + self.rope

    @property
    def prefill_width(self) -> int:
        """Elements a prefill chunk's expanded path (`_expanded`) holds per token of context at
        once: the gathered latent row, kv_b's [k_nope ; v] per head, the keys and the padded
        values SDPA reads, each [S, ...] in the activations' dtype."""
        h, keys = self.num_heads, self.nope + self.rope
        return self.latent_width + h * (self.nope + self.vdim) + h * keys + h * max(self.vdim, keys)

    def __call__(self, a: torch.Tensor, latents: torch.Tensor, start: int,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
        """a: [T, D] at positions start..start+T-1 -> [T, D]. latents: rows [N, R+P] of a latent
        cache; `rows` [start+T] int64: where positions 0..start+T-1 live in it (a paged pool's
        flat view, models/latent_pool.py), or None: position s is row s. Positions before
        start are gathered into one contiguous copy (a prefill pays it once per chunk)."""
        t, h = a.shape[0], self.num_heads
        latent = self._latent(a).to(latents.dtype)              # [T, R+P]
        if rows is None:
            latents[start:start + t] = latent
            seen = latents[:start + t]                          # [S, R+P]
        else:
            latents.index_copy_(0, rows[start:start + t], latent)
            seen = latents.index_select(0, rows)
        # fp32 on the CPU; the activations' dtype on a GPU (flash attention, fp32 inside)
        dtype = torch.float32 if a.device.type == "cpu" else a.dtype
        q = self.q_proj(a).to(dtype).view(t, h, self.nope + self.rope)
        path = self._absorbed if t <= ABSORB_MAX_T else self._expanded
        o = path(q, seen, start)                                # [T, H, V]
        return self.o_proj(o.reshape(t, -1).to(a.dtype))

    def decode_batch(self, a: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor,
                     positions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """One token for each of B sequences, row b at positions[b] of the sequence whose latent
        blocks block_tables[b] lists. a: [B, D]; pool: the layer's [NB, BLOCK, R+P];
        block_tables: [B, MB] int64; positions: [B] int64; lengths: positions + 1 (made once a
        step for every MLA layer, or here) -> [B, D]. Tensors only (no host sync): mla_latent
        writes each row's latent into its block, one paged_mla_decode call attends every row
        over its own rows, and W_UK/W_UV (in a's dtype) fold into the query and out of the
        mixed latents, one batched matmul each (a row at a time on the CPU: ops/rowwise.py).
        Rows of one sequence at consecutive positions (a verify step's drafts) see each other:
        every latent is written before any row attends."""
        b, h = a.shape[0], self.num_heads
        registry.resolve("mla_latent", pool.device.type).fn(
            self.kv_a_proj_with_mqa(a), self.kv_a_layernorm.weight, self.kv_a_layernorm.eps, pool,
            block_tables, positions)                            # [B, R+P] rows into the pool
        self._decode_dtype = a.dtype
        w_uk, w_uv = self._kv_b(a.dtype)
        q = self.q_proj(a).view(b, h, self.nope + self.rope)
        qn, qr = q[..., :self.nope], q[..., self.nope:]         # views: [B, H, N], [B, H, P]
        q_lat = rowwise(lambda x: torch.bmm(x.transpose(0, 1), w_uk).transpose(0, 1), qn)  # [B, H, R]
        decode = registry.resolve("paged_mla_decode", pool.device.type).fn
        lengths = positions + 1 if lengths is None else lengths
        mixed = decode(q_lat, qr, pool, block_tables, lengths, self.scale,
                       out=a.new_empty(b, h, self.rank))        # [B, H, R] in a's dtype
        o = rowwise(lambda x: torch.bmm(x.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1),
                    mixed)                                      # [B, H, V]
        return self.o_proj(o.reshape(b, -1))

    def _latent(self, a: torch.Tensor) -> torch.Tensor:
        # a: [T, D] -> the cached row [ĉ ; kr]: [T, R+P]
        c, kr = self.kv_a_proj_with_mqa(a).split((self.rank, self.rope), dim=-1)
        return torch.cat((self.kv_a_layernorm(c), kr), -1)

    def _kv_b(self, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK: [H, N, R], W_UV: [H, V, R] (kv_b rows are per head [k_nope | v]) in `dtype`:
        fp32 for the prefill's absorbed path, the activations' dtype for decode (bf16 on a GPU:
        tensor-core products, half the bytes read). Built once per dtype, at the first call
        (weights are complete by then)."""
        if dtype not in self._uk_uv:
            w = self.kv_b_proj.dense_weight(torch.float32)
            w = w.view(self.num_heads, self.nope + self.vdim, self.rank)
            self._uk_uv[dtype] = (w[:, :self.nope].to(dtype).contiguous(),
                                     w[:, self.nope:].to(dtype).contiguous())
        return self._uk_uv[dtype]

    def _expanded(self, q, seen, start):
        """K/V expanded from the latents, one SDPA call (flash on Hopper): no [H, T, S] scores.
        Flash wants V as wide as Q/K (HF pads it too), so V is zero-padded and cut after."""
        c, kr = seen.split((self.rank, self.rope), dim=-1)      # [S, R], [S, P]
        kv = self.kv_b_proj(c.to(q.dtype)).view(-1, self.num_heads, self.nope + self.vdim)
        kn, v = kv.split((self.nope, self.vdim), dim=-1)        # [S, H, N], [S, H, V]
        h, width = self.num_heads, self.nope + self.rope
        keys = torch.cat((kn, kr.to(q.dtype)[:, None].expand(-1, h, -1)), -1)    # [S, H, N+P]
        values = F.pad(v, (0, max(0, width - self.vdim)))       # [S, H, max(V, N+P)]
        o = attend(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), start,
                   self.scale)                                  # [H, T, ·]
        return o[..., :self.vdim].transpose(0, 1)               # [T, H, V]

    def _absorbed(self, q, seen, start):
        """Scores against the latents themselves (kv_b folded into the query and the output),
        one SDPA call with the latent row [ĉ ; kr] as every head's key and value (the value's
        ĉ part kept: SDPA's fused kernels want the widths equal)."""
        w_uk, w_uv = self._kv_b(q.dtype)
        qn, qr = q.split((self.nope, self.rope), dim=-1)
        q_lat = torch.bmm(qn.transpose(0, 1), w_uk)             # [H, T, R]: query in latent space
        rows = seen.to(q.dtype)[None].expand(self.num_heads, -1, -1)   # [H, S, R+P], a view
        mixed = attend(torch.cat((q_lat, qr.transpose(0, 1)), -1), rows, rows, start, self.scale)
        return torch.bmm(mixed[..., :self.rank], w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, V]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """Causal attention of queries at positions start..start+T-1 over keys 0..S-1 (S = start+T):
    q [H, T, E], k [H, S, E], v [H, S, Ev] -> [H, T, Ev] in q's dtype, through SDPA (flash on
    Hopper when E = Ev <= 256, else memory-efficient): no [H, T, S] scores. From position 0 the
    mask is SDPA's own causal one; after a prefix it is lower-right aligned, which CUDA's
    kernels apply themselves (causal_lower_right) and the CPU from a [T, S] bool mask."""
    t, s = q.shape[1], k.shape[1]
    q, k, v = q[None], k[None], v[None]                         # [1, H, ·, ·]: SDPA's fused kernels
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, scale=scale)[0]
    if q.is_cuda:  # imported here: torch.nn.attention.bias imports torch._dynamo (and numpy)
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(t, s)
    else:
        mask = torch.arange(s)[None, :] <= start + torch.arange(t)[:, None]   # [T, S] bool
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)[0]
