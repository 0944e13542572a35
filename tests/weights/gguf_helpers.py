"""Tiny synthetic llama GGUFs for repack/loader tests (written with gguf-py's own writer)."""
import pathlib

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

TINY = {"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 96, "layers": 2}


def _matrix(rng, n: int, k: int, kind: GGMLQuantizationType) -> np.ndarray:
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    return w if kind == GGMLQuantizationType.F32 else quantize(w, kind)


def write_tiny_llama(path: pathlib.Path, arch: str = "llama",
                     linear_type: GGMLQuantizationType = GGMLQuantizationType.Q4_1,
                     seed: int = 0) -> pathlib.Path:
    """A 2-layer llama GGUF: Q8_0 embedding, `linear_type` linears, F32 norms, no tokenizer."""
    rng = np.random.default_rng(seed)
    d, heads, kvh, ffn, vocab = (TINY[k] for k in ("hidden", "heads", "kv_heads", "ffn", "vocab"))
    hd = d // heads
    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny-llama")
    writer.add_block_count(TINY["layers"])
    writer.add_context_length(128)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kvh)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    q = GGMLQuantizationType.Q8_0
    writer.add_tensor("token_embd.weight", _matrix(rng, vocab, d, q), raw_dtype=q)
    shapes = {"attn_q": (d, d), "attn_k": (kvh * hd, d), "attn_v": (kvh * hd, d),
              "attn_output": (d, d), "ffn_gate": (ffn, d), "ffn_up": (ffn, d), "ffn_down": (d, ffn)}
    for i in range(TINY["layers"]):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", (1 + rng.random(d)).astype(np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + rng.random(d)).astype(np.float32))
        for role, (n, k) in shapes.items():
            writer.add_tensor(f"blk.{i}.{role}.weight", _matrix(rng, n, k, linear_type),
                              raw_dtype=None if linear_type == GGMLQuantizationType.F32 else linear_type)
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
