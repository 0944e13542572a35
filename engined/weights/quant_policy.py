"""Which Kimi-Linear tensors each quantization plan turns into packed INT4 (reference §5.2).

A table of full-match patterns, grouped by what the two plans do with them; a tensor that
no pattern matches is refused (fail closed, §8.26).
Imports no safetensors/tqdm, so the synthetic benchmark can use it on the GPU image.
"""
import re

from engined.weights.shards import CheckpointError

PLANS = ("selective", "all", "none")
L = r"model\.layers\.\d+\."
# (selective, all) -> the patterns of the tensors the plans treat so
POLICY = {
    ("keep", "keep"): (
        r"model\.(embed_tokens|norm)\.weight",
        L + r"(input|post_attention)_layernorm\.weight",
        L + r"self_attn\.(o_norm|kv_a_layernorm|(q|k|v)_conv1d)\.weight",
        L + r"self_attn\.(A_log|dt_bias)",
        L + r"block_sparse_moe\.gate\.(weight|e_score_correction_bias)",
    ),
    ("keep", "int4"): (
        r"lm_head\.weight",
        L + r"self_attn\.kv_a_proj_with_mqa\.weight",
        L + r"self_attn\.(f_a|f_b|g_a|g_b|b)_proj\.weight",
    ),
    ("int4", "int4"): (
        L + r"self_attn\.(q|k|v|o|kv_b)_proj\.weight",
        L + r"mlp\.(gate|up|down)_proj\.weight",
        L + r"block_sparse_moe\.shared_experts\.(gate|up|down)_proj\.weight",
        L + r"block_sparse_moe\.experts\.\d+\.w[123]\.weight",
    ),
}


class QuantizeError(CheckpointError):
    """The source cannot be quantized under this plan."""


def policy(name: str, plan: str) -> str:
    if plan == "none":
        return "keep"
    for (selective, everything), patterns in POLICY.items():
        if any(re.fullmatch(pattern, name) for pattern in patterns):
            return selective if plan == "selective" else everything
    raise QuantizeError(f"no quantization policy for tensor {name!r}; refusing to guess")
