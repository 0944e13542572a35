"""Plain reference for llama_decode_layer: today's Python block (engined/layers/decoder_block.py's
Block.decode_batch), its linears on the plain reference of the layer's GEMV op.

| tensor      | shape                      | dtype                                     |
|-------------|----------------------------|-------------------------------------------|
| h           | [B, D]                     | fp32, B <= helper.MAX_ROWS                |
| attn_norm   | [D]                        | fp32 (ffn_norm the same)                  |
| qkv         | [(H + 2 KVH) hd, D]        | PackedInt4: q rows, then k, then v        |
| o           | [D, H hd]                  | PackedInt4                                |
| gate_up     | [2 F, D]                   | PackedInt4: gate rows, then up            |
| down        | [D, F]                     | PackedInt4                                |
| cos, sin    | [B, hd]                    | fp32, RotaryEmbedding's tables (sin's first half negated) |
| kv          | B x [2, S_max, KVH, hd]    | fp16: row b's cache of this layer; k and v are written at positions[b] |
| positions   | B                          | ints, 0 <= positions[b] < S_max           |
| out         | [B, D]                     | fp32: h + attention + MLP                 |

Attention for row b sees its cache rows 0..positions[b] only (what a prefix-cache restore
put there, then this token). Tolerance against this reference: 2e-4 + 1e-4 * |y| (tests/ops/
helpers.py; measured at most 3.4e-5 on outputs up to 67; the cached k and v equal but for a rare
one-step fp16 rounding of a value on a rounding boundary): the
C variant sums in another order (online softmax, float32 dots, double RMS sums), and under
w4a8_gemv a normed value that lands on a rounding tie may take the neighbouring int8 code.
"""
from dataclasses import dataclass

import torch

from engined.ops import int4_format, registry

GEMV_OPS = ("w4a16_gemv", "w4a8_gemv", "w4a8_tiles")


@dataclass(frozen=True, eq=False)
class LlamaLayer:
    """One decoder layer's weights, as the op takes them (a model builds it once per layer)."""

    attn_norm: torch.Tensor          # [D] fp32
    ffn_norm: torch.Tensor           # [D] fp32
    eps: float
    qkv: int4_format.PackedInt4      # [(H + 2 KVH) hd, D]
    o: int4_format.PackedInt4        # [D, H hd]
    gate_up: int4_format.PackedInt4  # [2 F, D]
    down: int4_format.PackedInt4     # [D, F]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    gemv: str = "w4a16_gemv"         # the GEMV op its projections run: one of GEMV_OPS

    def __post_init__(self):
        if self.gemv not in GEMV_OPS:
            raise registry.KernelError(f"llama_decode_layer: gemv must be one of {GEMV_OPS}, "
                                       f"got {self.gemv!r}")

    @property
    def inner(self) -> int:
        return self.gate_up.shape[0] // 2


def python_block(layer: LlamaLayer, variant: str | None = None):
    """The model's Block over this layer's weights; its linears run `variant` of layer.gemv
    (None: the registry's choice, as the model's own blocks do)."""
    # imported here: engined.layers.linear imports engined.ops, whose __init__ imports this
    from engined.layers.attention import Attention
    from engined.layers.decoder_block import Block
    from engined.layers.linear import Linear
    from engined.layers.mlp import SwiGLU
    from engined.layers.rmsnorm import RMSNorm

    hd, h, kvh = layer.head_dim, layer.num_heads, layer.num_kv_heads
    qkv, gate_up = Linear.from_packed(layer.qkv), Linear.from_packed(layer.gate_up)
    q, k, v = (qkv.rows(a, b) for a, b in ((0, h * hd), (h * hd, (h + kvh) * hd),
                                          ((h + kvh) * hd, (h + 2 * kvh) * hd)))
    attn = Attention(q, k, v, Linear.from_packed(layer.o), h, kvh, hd)
    mlp = SwiGLU(gate_up.rows(0, layer.inner), gate_up.rows(layer.inner, 2 * layer.inner),
                 Linear.from_packed(layer.down)).fuse()
    for lin in (attn.qkv, attn.o, mlp.gate_up, mlp.down_proj):
        lin.select_gemv(layer.gemv, variant)
    return Block(RMSNorm.from_weight(layer.attn_norm, layer.eps), attn,
                 RMSNorm.from_weight(layer.ffn_norm, layer.eps), mlp)


@registry.register("llama_decode_layer", registry.REFERENCE,
                   description="the Python block, its GEMVs on their plain references")
@torch.inference_mode()
def llama_decode_layer(h: torch.Tensor, layer: LlamaLayer, cos: torch.Tensor, sin: torch.Tensor,
                       kv: list[torch.Tensor], positions: list[int],
                       out: torch.Tensor | None = None) -> torch.Tensor:
    y = python_block(layer, registry.REFERENCE).decode_batch(h.float(), cos, sin, kv,
                                                              [int(p) for p in positions])
    return y if out is None else out.copy_(y)
