"""Llama-architecture forward (SmolLM2 and kin): fp32 activations, INT4 linears, one KV cache
per sequence. This module only wires layers; the checkpoint names are the WEIGHTS table."""
import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from engined.layers.attention import Attention
from engined.layers.decoder_block import Block
from engined.layers.embedding import Q8TiedEmbedding, TiedEmbedding
from engined import helper
from engined.layers.linear import Linear
from engined.layers.mlp import SwiGLU
from engined.layers.rmsnorm import RMSNorm
from engined.layers.rope import RotaryEmbedding
from engined.models.protocol import check_span
from engined.ops import int4_format, registry
from engined.ops.llama_decode_layer.reference import LlamaLayer
from engined.ops.q8_gemv.reference import PackedQ8
from engined.ops.w4a16_gemv.cpu_c import torch_single_threaded
from engined.weights import hugepages

# Layer slot -> artifact name ({i}: block index). INT4 names carry .qweight/.scales/.mins.
NORM_WEIGHTS = {"attn_norm": "blk.{i}.attn_norm.weight", "ffn_norm": "blk.{i}.ffn_norm.weight"}
INT4_WEIGHTS = {"q": "blk.{i}.attn_q", "k": "blk.{i}.attn_k", "v": "blk.{i}.attn_v",
                "o": "blk.{i}.attn_output", "gate": "blk.{i}.ffn_gate", "up": "blk.{i}.ffn_up",
                "down": "blk.{i}.ffn_down"}
FINAL_NORM = "output_norm.weight"
log = logging.getLogger(__name__)
EMBEDDING = "token_embd"


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    context_length: int
    tie_embeddings: bool

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads do not split into {self.num_kv_heads} KV groups")
        if self.head_dim % 2 or min(self.vocab_size, self.hidden_size, self.num_layers,
                                    self.context_length) <= 0:
            raise ValueError(f"impossible llama config: {self}")
        if not self.tie_embeddings:
            raise ValueError("untied output embeddings are not supported yet")

    @classmethod
    def from_hparams(cls, hp: dict, vocab_size: int, tie_embeddings: bool) -> "LlamaConfig":
        """From GGUF llama.* keys (as recorded by the repack)."""
        heads = int(hp["llama.attention.head_count"])
        hidden = int(hp["llama.embedding_length"])
        return cls(vocab_size=int(hp.get("llama.vocab_size", vocab_size)), hidden_size=hidden,
                   num_layers=int(hp["llama.block_count"]), num_heads=heads,
                   num_kv_heads=int(hp.get("llama.attention.head_count_kv", heads)),
                   head_dim=int(hp.get("llama.rope.dimension_count", hidden // heads)),
                   intermediate_size=int(hp["llama.feed_forward_length"]),
                   rope_theta=float(hp.get("llama.rope.freq_base", 10000.0)),
                   rms_eps=float(hp["llama.attention.layer_norm_rms_epsilon"]),
                   context_length=int(hp["llama.context_length"]), tie_embeddings=tie_embeddings)

    def kv_bytes_per_token(self, kv_dtype: torch.dtype) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * kv_dtype.itemsize


@dataclass
class KVCache:
    """One sequence. data: [L, 2, max_tokens, KVH, hd]; pages are touched only as they fill."""

    data: torch.Tensor

    is_recurrent = False  # rows alone resume a sequence (engined/engine/prefix_cache.py)

    @property
    def max_tokens(self) -> int:
        return self.data.shape[2]

    def read_rows(self, start: int, end: int) -> torch.Tensor:
        """A copy of positions [start, end): [L, 2, end-start, KVH, hd]."""
        return self.data[:, :, start:end].clone()

    def write_rows(self, start: int, rows: torch.Tensor):
        self.data[:, :, start:start + rows.shape[2]].copy_(rows)

    def save_state(self) -> None:
        return None

    def load_state(self, state: None, num_tokens: int):
        pass


def layer_weights(block: Block, gemv: str) -> LlamaLayer:
    """A block as llama_decode_layer takes it (the same tensors, no copy)."""
    a = block.attn
    return LlamaLayer(block.attn_norm.weight, block.ffn_norm.weight, block.attn_norm.eps,
                      a.qkv.packed, a.o.packed, block.mlp.gate_up.packed, block.mlp.down_proj.packed,
                      a.num_heads, a.num_kv_heads, a.head_dim, gemv)


def decode_gemv_op(device: str) -> str:
    """The projections' op of the Llama family: W4A8 in tiles (x rounded to int8 per 32-block;
    the quality gate, bench/quality.py, holds it against W4A16), one kernel for decode, verify
    and prefill rows, on a CPU whose integer dots are at least as wide as W4A16's fp32 FMAs:
    VNNI (AVX-512; AVX-VNNI runs the AVX2 tile kernel), or AVX2 without AVX-512. An AVX-512
    CPU without VNNI keeps W4A16's AVX-512 kernel, and GPUs W4A16."""
    if device != "cpu" or not helper.available():
        return "w4a16_gemv"
    return "w4a8_tiles" if helper.w4a8_simd() >= 2 or helper.gemv_simd() <= 1 else "w4a16_gemv"


class LlamaModel:
    def __init__(self, config: LlamaConfig, blocks: list[Block], final_norm: RMSNorm,
                 embedding: "TiedEmbedding | Q8TiedEmbedding", kv_dtype: torch.dtype = torch.float16,
                 device: str = "cpu"):
        self.config, self.blocks, self.final_norm, self.embedding = config, blocks, final_norm, embedding
        self.kv_dtype, self.device = kv_dtype, device
        self.decode_gemv = "w4a16_gemv"
        self.decode_layer, self.decode_layers = None, []  # select_decode_gemv sets them
        self.arena = None  # the CPU weights' 2 MiB pages (select_decode_gemv gathers them)
        # Rows of one sequence at consecutive positions each write their K/V row before any
        # row attends (the layer call, and the blocks' per-row attention), and every op is
        # row-invariant (the W4A8 rows take the 4-row kernel's operations, 419bbf0):
        # tests/engine/test_speculative.py holds them to a lone step's bits.
        self.verifies_drafts = True
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.kv_bytes_per_token = config.kv_bytes_per_token(kv_dtype)
        self.state_bytes = 0  # rows alone resume a sequence
        norms = [final_norm] + [n for b in blocks for n in (b.attn_norm, b.ffn_norm)]
        linears = [lin for b in blocks for lin in (b.attn.qkv, b.attn.o, b.mlp.gate_up, b.mlp.down_proj)]
        self.weight_bytes = (embedding.nbytes + sum(lin.nbytes for lin in linears)
                             + sum(n.weight.numel() * 4 for n in norms))

    @classmethod
    def build(cls, config: LlamaConfig, load_norm: Callable[[str], torch.Tensor],
              load_int4: Callable, embedding_weight: "torch.Tensor | PackedQ8",
              kv_dtype: torch.dtype = torch.float16, device: str = "cpu") -> "LlamaModel":
        """Wire the model from loader callbacks (name -> tensor / PackedInt4), one layer at a time."""
        blocks = []
        for i in range(config.num_layers):
            lin = {slot: Linear.from_packed(load_int4(name.format(i=i)), device)
                   for slot, name in INT4_WEIGHTS.items()}
            norm = {slot: RMSNorm.from_weight(load_norm(name.format(i=i)), config.rms_eps)
                    for slot, name in NORM_WEIGHTS.items()}
            attn = Attention(lin["q"], lin["k"], lin["v"], lin["o"], config.num_heads,
                             config.num_kv_heads, config.head_dim)
            blocks.append(Block(norm["attn_norm"], attn, norm["ffn_norm"],
                                SwiGLU(lin["gate"], lin["up"], lin["down"]).fuse(device)))
        final_norm = RMSNorm.from_weight(load_norm(FINAL_NORM), config.rms_eps)
        embedding = (Q8TiedEmbedding(embedding_weight) if isinstance(embedding_weight, PackedQ8)
                     else TiedEmbedding(embedding_weight))
        model = cls(config, blocks, final_norm, embedding, kv_dtype, device)
        model.select_decode_gemv(decode_gemv_op(device))
        return model

    def select_decode_gemv(self, op: str):
        """Decode rows of every INT4 linear through `op`: w4a16_gemv, w4a8_gemv, or
        w4a8_tiles, which puts the weights into the CPU's tiles in place and then runs every
        row, decode and prefill (w4a8_gemv where a shape does not tile)."""
        linears = [lin for b in self.blocks
                   for lin in (b.attn.qkv, b.attn.o, b.mlp.gate_up, b.mlp.down_proj)]
        tiles = op == "w4a8_tiles" and all(
            lin.packed.tiles or int4_format.can_tile(lin.packed) for lin in linears) and all(
            size % int4_format.TILE == 0 for b in self.blocks for size in (b.mlp.hidden, *b.attn.split))
        if op == "w4a8_tiles" and not tiles:
            op = "w4a8_gemv"
        for block in self.blocks:
            block.attn.qkv.to_tiles_(back=not tiles)
            block.attn.o.to_tiles_(back=not tiles)
            block.mlp.to_tiles_(back=not tiles)
        if isinstance(self.embedding, Q8TiedEmbedding) and self.embedding.packed.q.shape[0] % int4_format.TILE == 0:
            self.embedding.to_tiles_(back=not tiles)  # the head too: its verify rows are cheap
        if not tiles:
            for lin in linears:
                lin.select_gemv(op)
        if self.device == "cpu" and self.arena is None:  # in their final layout, once
            self.arena = hugepages.gather_(
                [t for lin in linears for t in (lin.packed.qweight, lin.packed.scales, lin.packed.mins)]
                + self.embedding.weight_tensors())
            for block in self.blocks:  # gate and up: views of the moved rows, not the old ones
                block.mlp.view_rows()
        self.decode_gemv = op
        self.decode_layer = self._decode_layer_fn()
        self.decode_layers = [layer_weights(block, op) for block in self.blocks] if self.decode_layer else []

    def _decode_layer_fn(self) -> Callable | None:
        """The llama_decode_layer variant decode runs per layer (through its step-wide form,
        `all_layers`), or None: the blocks run themselves (the op's reference is the block, so
        that is the same computation on the selected GEMVs), as on a GPU or where a variant
        refuses this model's shapes."""
        variant = registry.resolve("llama_decode_layer", self.device)
        if not hasattr(variant.fn, "all_layers"):  # the reference: the blocks themselves
            return None
        c = self.config  # a one-token probe: the variant accepts these shapes, or says why not
        cos, sin = self.rope.cos_sin(0, 1)
        cache = torch.zeros(2, 1, c.num_kv_heads, c.head_dim, dtype=self.kv_dtype, device=self.device)
        try:
            variant.fn(torch.zeros(1, c.hidden_size, device=self.device),
                       layer_weights(self.blocks[0], self.decode_gemv), cos, sin, [cache], [0])
        except registry.KernelError as exc:
            log.warning("llama_decode_layer %s refused this model, the blocks run: %s",
                        variant.name, exc)
            return None
        return variant.fn

    def new_cache(self, max_tokens: int) -> KVCache:
        if not 0 < max_tokens <= self.config.context_length:
            raise ValueError(f"cache of {max_tokens} tokens: must be 1..{self.config.context_length}")
        c = self.config
        shape = (c.num_layers, 2, max_tokens, c.num_kv_heads, c.head_dim)
        return KVCache(torch.empty(shape, dtype=self.kv_dtype, device=self.device))

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: KVCache, start: int,
                last_only: bool = True) -> torch.Tensor:
        """tokens: [T] int64 at positions start..start+T-1 -> logits fp32 [1, V] or [T, V]."""
        t = check_span(tokens, cache, start)
        with self._decode_threads() if t == 1 else contextlib.nullcontext():
            cos, sin = self.rope.cos_sin(start, t)
            h = self.embedding.embed(tokens.to(self.device))  # [T, D]
            for block, layer_cache in zip(self.blocks, cache.data):
                h = block(h, cos, sin, layer_cache, start)
            if last_only:
                h = h[-1:]
            return self.embedding.logits(self.final_norm(h))  # [T or 1, V]

    @torch.inference_mode()
    def graph_step(self, rows: int, max_context: int) -> None:
        """No capturable step: the KV caches are per-sequence tensors, and the CPU path it
        serves runs eagerly anyway."""
        return None

    def decode_batch(self, tokens: torch.Tensor, caches: list[KVCache],
                     positions: list[int]) -> torch.Tensor:
        """One token for each of B sequences -> logits fp32 [B, V]. tokens: [B] int64; token i
        sits at positions[i] of caches[i]. The linear layers run once for all rows (in groups
        the GEMV takes in one pass), attention per sequence; each row equals a lone forward."""
        for cache, pos in zip(caches, positions):
            if not 0 <= pos < cache.max_tokens:
                raise ValueError(f"position {pos} does not fit a cache of {cache.max_tokens} tokens")
        rows = helper.MAX_ROWS
        if len(positions) > rows:
            return torch.cat([self.decode_batch(tokens[i:i + rows], caches[i:i + rows], positions[i:i + rows])
                              for i in range(0, len(positions), rows)])
        with self._decode_threads():
            cos, sin = self.rope.at_positions(positions)  # [B, hd]
            h = self.embedding.embed(tokens.to(self.device))  # [B, D]
            if self.decode_layer is not None:  # one native call: the layers, then the norm
                return self.embedding.logits(self.decode_layer.all_layers(
                    h, self.decode_layers, cos, sin, [c.data for c in caches], positions,
                    final_norm=self.final_norm))  # [B, V]
            for i, block in enumerate(self.blocks):
                h = block.decode_batch(h, cos, sin, [cache.data[i] for cache in caches], positions)
            return self.embedding.logits(self.final_norm(h))  # [B, V]

    def _decode_threads(self):
        """Decode's small torch ops on one thread (the C kernels keep theirs) on the CPU."""
        return torch_single_threaded() if self.device == "cpu" else contextlib.nullcontext()
