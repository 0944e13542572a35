"""The Llama family's decoder block: pre-norm attention and SwiGLU, each with its residual."""
import torch

from engined.layers.attention import Attention
from engined.layers.mlp import SwiGLU
from engined.layers.rmsnorm import RMSNorm


class Block:
    def __init__(self, attn_norm: RMSNorm, attn: Attention, ffn_norm: RMSNorm, mlp: SwiGLU):
        self.attn_norm, self.attn, self.ffn_norm, self.mlp = attn_norm, attn, ffn_norm, mlp

    def __call__(self, h, cos, sin, layer_cache: torch.Tensor, start: int) -> torch.Tensor:
        # h: [T, D]; layer_cache: [2, S_max, KVH, hd]
        h = h + self.attn(self.attn_norm(h), cos, sin, layer_cache[0], layer_cache[1], start)
        return h + self.mlp(self.ffn_norm(h))

    def decode_batch(self, h, cos, sin, layer_caches: list[torch.Tensor], positions: list[int]):
        # h: [B, D]; layer_caches: B x [2, S_max, KVH, hd]
        kv = [(c[0], c[1]) for c in layer_caches]
        h = h + self.attn.decode_batch(self.attn_norm(h), cos, sin, kv, positions)
        return h + self.mlp(self.ffn_norm(h))
