"""KimiLinearConfig: the frozen, validated view of a Kimi-Linear config.json (reference §1).

Layer lists in linear_attn_config are ONE-based in the file (§8.8); here they are zero-based.
"""
from dataclasses import dataclass, fields

import torch


class ConfigError(ValueError):
    """config.json does not describe a Kimi-Linear model this engine can run."""


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class KimiLinearConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    rms_norm_eps: float
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kda_num_heads: int
    kda_head_dim: int
    conv_kernel_size: int
    kda_layers: tuple[int, ...]        # zero-based
    mla_layers: tuple[int, ...]        # zero-based
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    moe_layer_freq: int
    moe_renormalize: bool
    routed_scaling_factor: float
    context_length: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    torch_dtype: str

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def __post_init__(self):
        n = self.num_hidden_layers
        kda, mla = set(self.kda_layers), set(self.mla_layers)
        if kda & mla or (kda | mla) != set(range(n)):
            raise ConfigError(f"linear_attn_config must put each of the {n} layers in exactly one of "
                              f"kda_layers / full_attn_layers (one-based); got kda={sorted(kda)}, "
                              f"mla={sorted(mla)} (zero-based)")
        if not 0 < self.num_experts_per_token <= self.num_experts:
            raise ConfigError(f"num_experts_per_token={self.num_experts_per_token} must be in "
                              f"1..num_experts={self.num_experts}")
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "kv_lora_rank", "kda_num_heads", "kda_head_dim", "conv_kernel_size",
                    "context_length", "moe_layer_freq")
        bad = [k for k in positive if getattr(self, k) <= 0]
        if bad:
            raise ConfigError(f"config fields must be positive: {', '.join(bad)}")
        if self.torch_dtype not in DTYPES:
            raise ConfigError(f"torch_dtype {self.torch_dtype!r} not one of {sorted(DTYPES)}")


def _one_based(values, key: str, n: int) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(isinstance(v, int) and 1 <= v <= n for v in values):
        raise ConfigError(f"linear_attn_config.{key} must be a list of one-based layer numbers 1..{n}")
    return tuple(sorted(v - 1 for v in values))


def _require(raw: dict, key: str, want):
    if raw.get(key, want) != want:
        raise ConfigError(f"{key}={raw.get(key)!r} is not supported (Kimi-Linear uses {want!r})")


def parse_config(raw: dict) -> KimiLinearConfig:
    """config.json dict -> KimiLinearConfig; refuses variants this engine does not implement."""
    if raw.get("model_type") != "kimi_linear":
        raise ConfigError(f"model_type {raw.get('model_type')!r} is not 'kimi_linear'")
    for key, want in (("q_lora_rank", None), ("mla_use_nope", True), ("num_expert_group", 1),
                      ("topk_group", 1), ("moe_router_activation_func", "sigmoid")):
        _require(raw, key, want)
    if raw.get("num_key_value_heads", raw["num_attention_heads"]) != raw["num_attention_heads"]:
        raise ConfigError("MLA needs num_key_value_heads == num_attention_heads")
    lin, n = raw.get("linear_attn_config") or {}, raw["num_hidden_layers"]
    try:
        values = dict(
            kda_num_heads=lin["num_heads"], kda_head_dim=lin["head_dim"],
            conv_kernel_size=lin.get("short_conv_kernel_size", 4),
            kda_layers=_one_based(lin.get("kda_layers"), "kda_layers", n),
            mla_layers=_one_based(lin.get("full_attn_layers"), "full_attn_layers", n),
            num_experts_per_token=raw.get("num_experts_per_token", raw.get("num_experts_per_tok")),
            context_length=raw.get("model_max_length", raw.get("max_position_embeddings", 4096)),
            torch_dtype=raw.get("torch_dtype", raw.get("dtype", "bfloat16")),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            moe_renormalize=raw.get("moe_renormalize", True),
            moe_layer_freq=raw.get("moe_layer_freq", 1),
            first_k_dense_replace=raw.get("first_k_dense_replace", 0),
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
            num_shared_experts=raw.get("num_shared_experts", 0),
            bos_token_id=raw.get("bos_token_id"), eos_token_id=_first(raw.get("eos_token_id")),
            pad_token_id=raw.get("pad_token_id"))
        if values["num_experts_per_token"] is None:
            raise KeyError("num_experts_per_token")
        for f in fields(KimiLinearConfig):
            if f.name not in values:
                values[f.name] = raw[f.name]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"config.json is missing a Kimi-Linear field: {exc}") from None
    return KimiLinearConfig(**values)


def _first(v):
    return v[0] if isinstance(v, list) and v else v
