"""Which Kimi-Linear tensors each quantization plan turns into packed INT4 (reference §5.2).

A table of full-match patterns; a tensor without a row is refused (fail closed, §8.26).
Imports no safetensors/tqdm, so the synthetic benchmark can use it on the GPU image.
"""
import re

from engined.weights.shards import CheckpointError

PLANS = ("selective", "all", "none")
L = r"model\.layers\.\d+\."
# (pattern, selective, all): "int4" or "keep"
POLICY = (
    (r"model\.embed_tokens\.weight", "keep", "keep"),
    (r"lm_head\.weight", "keep", "int4"),
    (r"model\.norm\.weight", "keep", "keep"),
    (L + r"(input|post_attention)_layernorm\.weight", "keep", "keep"),
    (L + r"self_attn\.(q|k|v|o)_proj\.weight", "int4", "int4"),
    (L + r"self_attn\.kv_b_proj\.weight", "int4", "int4"),
    (L + r"self_attn\.kv_a_proj_with_mqa\.weight", "keep", "int4"),
    (L + r"self_attn\.(o_norm|kv_a_layernorm)\.weight", "keep", "keep"),
    (L + r"self_attn\.(q|k|v)_conv1d\.weight", "keep", "keep"),
    (L + r"self_attn\.(f_a|f_b|g_a|g_b|b)_proj\.weight", "keep", "int4"),
    (L + r"self_attn\.(A_log|dt_bias)", "keep", "keep"),
    (L + r"mlp\.(gate|up|down)_proj\.weight", "int4", "int4"),
    (L + r"block_sparse_moe\.gate\.weight", "keep", "keep"),
    (L + r"block_sparse_moe\.gate\.e_score_correction_bias", "keep", "keep"),
    (L + r"block_sparse_moe\.shared_experts\.(gate|up|down)_proj\.weight", "int4", "int4"),
    (L + r"block_sparse_moe\.experts\.\d+\.w[123]\.weight", "int4", "int4"),
)


class QuantizeError(CheckpointError):
    """The source cannot be quantized under this plan."""


def policy(name: str, plan: str) -> str:
    if plan == "none":
        return "keep"
    for pattern, selective, everything in POLICY:
        if re.fullmatch(pattern, name):
            return selective if plan == "selective" else everything
    raise QuantizeError(f"no quantization policy for tensor {name!r}; refusing to guess")
