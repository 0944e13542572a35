"""Multi-head Latent Attention, NoPE (reference §2.4). The cache holds the compressed latent only:
per position [ĉ (normed latent, R) ; kr (P)], R = kv_lora_rank, P = qk_rope_head_dim.

Short calls (decode, small prefill chunks) absorb kv_b into the query and output; long prefill
chunks expand K/V from the cached latents. Batched decode reads each row's latents through its
block table (ops/paged_mla_decode).
Letters: t query, s key position, h head, r latent dim, n nope dim, p rope-slice dim, v value dim.
"""
import torch

from engined.layers.linear import Linear
from engined.layers.rmsnorm import RMSNorm
from engined.ops import registry

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
            seen = latents[:start + t].float()                  # [S, R+P]
        else:
            latents.index_copy_(0, rows[start:start + t], latent)
            seen = latents.index_select(0, rows).float()
        q = self.q_proj(a).float().view(t, h, self.nope + self.rope)
        attend = self._absorbed if t <= ABSORB_MAX_T else self._expanded
        o = attend(q, seen, start)                              # [T, H, V] fp32
        return self.o_proj(o.reshape(t, -1).to(a.dtype))

    def decode_batch(self, a: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor,
                     positions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """One token for each of B sequences, row b at positions[b] of the sequence whose latent
        blocks block_tables[b] lists. a: [B, D]; pool: the layer's [NB, BLOCK, R+P];
        block_tables: [B, MB] int64; positions: [B] int64; lengths: positions + 1 (made once a
        step for every MLA layer, or here) -> [B, D]. Tensors only (no host sync): mla_latent
        writes each row's latent into its block, one paged_mla_decode call attends every row
        over its own rows, and W_UK/W_UV (in a's dtype) fold into the query and out of the
        mixed latents, one batched matmul each."""
        b, h = a.shape[0], self.num_heads
        registry.resolve("mla_latent", pool.device.type).fn(
            self.kv_a_proj_with_mqa(a), self.kv_a_layernorm.weight, self.kv_a_layernorm.eps, pool,
            block_tables, positions)                            # [B, R+P] rows into the pool
        self._decode_dtype = a.dtype
        w_uk, w_uv = self._kv_b(a.dtype)
        q = self.q_proj(a).view(b, h, self.nope + self.rope)
        qn, qr = q[..., :self.nope], q[..., self.nope:]         # views: [B, H, N], [B, H, P]
        q_lat = torch.bmm(qn.transpose(0, 1), w_uk).transpose(0, 1)   # [B, H, R], a view
        decode = registry.resolve("paged_mla_decode", pool.device.type).fn
        lengths = positions + 1 if lengths is None else lengths
        mixed = decode(q_lat, qr, pool, block_tables, lengths, self.scale,
                       out=a.new_empty(b, h, self.rank))        # [B, H, R] in a's dtype
        o = torch.bmm(mixed.transpose(0, 1), w_uv.transpose(1, 2))    # [H, B, V]
        return self.o_proj(o.transpose(0, 1).reshape(b, -1))

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

    def _probs(self, scores: torch.Tensor, start: int) -> torch.Tensor:
        # scores: [H, T, S] -> causal softmax (query t sees s <= start + t), fp32
        t, s = scores.shape[1:]
        pos = torch.arange(s, device=scores.device)
        mask = pos[None, :] > (start + torch.arange(t, device=scores.device))[:, None]
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)

    def _expanded(self, q, seen, start):
        c, kr = seen.split((self.rank, self.rope), dim=-1)      # [S, R], [S, P]
        kv = self.kv_b_proj(c).float().view(-1, self.num_heads, self.nope + self.vdim)
        kn, v = kv.split((self.nope, self.vdim), dim=-1)        # [S, H, N], [S, H, V]
        qn, qr = q.split((self.nope, self.rope), dim=-1)        # [T, H, N], [T, H, P]
        scores = torch.einsum("thn,shn->hts", qn, kn) + torch.einsum("thp,sp->hts", qr, kr)
        return torch.einsum("hts,shv->thv", self._probs(scores * self.scale, start), v)

    def _absorbed(self, q, seen, start):
        w_uk, w_uv = self._kv_b()
        c, kr = seen.split((self.rank, self.rope), dim=-1)
        qn, qr = q.split((self.nope, self.rope), dim=-1)
        q_lat = torch.einsum("thn,hnr->thr", qn, w_uk)          # query folded into latent space
        scores = torch.einsum("thr,sr->hts", q_lat, c) + torch.einsum("thp,sp->hts", qr, kr)
        mixed = torch.einsum("hts,sr->thr", self._probs(scores * self.scale, start), c)
        return torch.einsum("thr,hvr->thv", mixed, w_uv)
