import torch
import torch.nn.functional as F

from engined.layers.linear import Linear
from engined.layers.rope import RotaryEmbedding


class Attention:
    """Grouped-query attention over one sequence's KV cache (rotate-half RoPE on q and k)."""

    def __init__(self, q: Linear, k: Linear, v: Linear, o: Linear,
                 num_heads: int, num_kv_heads: int, head_dim: int):
        self.qkv, self.o = Linear.stacked([q, k, v]), o  # one GEMV for q, k and v
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.split = (num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, start: int) -> torch.Tensor:
        # x: [T, D]; cos, sin: [T, hd]; k_cache, v_cache: [S_max, KVH, hd]
        q, k, v = self._project(x, cos, sin)
        return self.o(self._attend(q, k, v, k_cache, v_cache, start))

    def decode_batch(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     kv: list[tuple[torch.Tensor, torch.Tensor]],
                     positions: list[int]) -> torch.Tensor:
        """One token for each of B sequences: the projections run once over all rows, the
        attention per sequence over its own cache. x: [B, D]; cos, sin: [B, hd] -> [B, D]."""
        q, k, v = self._project(x, cos, sin)
        rows = [self._attend(q[i:i + 1], k[i:i + 1], v[i:i + 1], k_cache, v_cache, pos)
                for i, ((k_cache, v_cache), pos) in enumerate(zip(kv, positions))]
        return self.o(torch.cat(rows))

    def _project(self, x, cos, sin):
        # x: [T, D] -> q [T, H, hd], k, v [T, KVH, hd] (q and k rotated)
        t, h = x.shape[0], self.num_heads
        qk, v = self.qkv(x).split((self.split[0] + self.split[1], self.split[2]), dim=-1)
        qk = RotaryEmbedding.apply(qk.view(t, h + self.num_kv_heads, self.head_dim), cos, sin)
        return qk[:, :h], qk[:, h:], v.view(t, self.num_kv_heads, self.head_dim)

    def _attend(self, q, k, v, k_cache, v_cache, start: int) -> torch.Tensor:
        # q: [T, H, hd]; k, v: [T, KVH, hd] at positions start.. -> [T, H*hd]
        t, end = q.shape[0], start + q.shape[0]
        k_cache[start:end] = k
        v_cache[start:end] = v
        keys = k_cache[:end].float().transpose(0, 1)[None]  # [1, KVH, S, hd]
        values = v_cache[:end].float().transpose(0, 1)[None]  # [1, KVH, S, hd]
        queries = q.transpose(0, 1)[None]  # [1, H, T, hd]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=causal_mask(start, t),
                                             enable_gqa=True)  # [1, H, T, hd]
        return out[0].transpose(0, 1).reshape(t, self.num_heads * self.head_dim)


def causal_mask(start: int, length: int) -> torch.Tensor | None:
    """[T, S] bool, True where query start+i may see key j (j <= start+i); None for one query."""
    if length == 1:
        return None
    query_pos = torch.arange(start, start + length)[:, None]
    return torch.arange(start + length)[None, :] <= query_pos
