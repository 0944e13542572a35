import torch
import torch.nn.functional as F

from engined.layers.linear import Int4Linear
from engined.layers.rope import RotaryEmbedding


class Attention:
    """Grouped-query attention over one sequence's KV cache (rotate-half RoPE on q and k)."""

    def __init__(self, q: Int4Linear, k: Int4Linear, v: Int4Linear, o: Int4Linear,
                 num_heads: int, num_kv_heads: int, head_dim: int):
        self.q, self.k, self.v, self.o = q, k, v, o
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, start: int) -> torch.Tensor:
        # x: [T, D]; cos, sin: [T, hd]; k_cache, v_cache: [S_max, KVH, hd]
        t = x.shape[0]
        q = RotaryEmbedding.apply(self.q(x).view(t, self.num_heads, self.head_dim), cos, sin)
        k = RotaryEmbedding.apply(self.k(x).view(t, self.num_kv_heads, self.head_dim), cos, sin)
        end = start + t
        k_cache[start:end] = k
        v_cache[start:end] = self.v(x).view(t, self.num_kv_heads, self.head_dim)
        keys = k_cache[:end].float().transpose(0, 1)[None]  # [1, KVH, S, hd]
        values = v_cache[:end].float().transpose(0, 1)[None]  # [1, KVH, S, hd]
        queries = q.transpose(0, 1)[None]  # [1, H, T, hd]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=causal_mask(start, t),
                                             enable_gqa=True)  # [1, H, T, hd]
        return self.o(out[0].transpose(0, 1).reshape(t, self.num_heads * self.head_dim))


def causal_mask(start: int, length: int) -> torch.Tensor | None:
    """[T, S] bool, True where query start+i may see key j (j <= start+i); None for one query."""
    if length == 1:
        return None
    query_pos = torch.arange(start, start + length)[:, None]
    return torch.arange(start + length)[None, :] <= query_pos
