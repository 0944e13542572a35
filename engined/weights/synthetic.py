"""Random Kimi-Linear weights made directly on the device, through the checkpoint table, for the
synthetic benchmark. CONFIGS holds the real 48B config.json (reference §1.1) and small ones."""
import math
import re

import torch

from engined.weights import kimi_table as table
from engined.weights.quant_policy import policy
from engined.layers.linear import Linear
from engined.layers.moe import ExpertBank
from engined.models.kimi_linear import weight_tensors

KIMI_LINEAR_48B = {
    "model_type": "kimi_linear", "torch_dtype": "bfloat16", "vocab_size": 163840, "hidden_size": 2304,
    "intermediate_size": 9216, "num_hidden_layers": 27, "num_attention_heads": 32,
    "num_key_value_heads": 32, "rms_norm_eps": 1e-5, "bos_token_id": 163584, "eos_token_id": 163586,
    "pad_token_id": 163839, "tie_word_embeddings": False, "model_max_length": 1048576,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "mla_use_nope": True,
    "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                           "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
                           "full_attn_layers": [4, 8, 12, 16, 20, 24, 27]},
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446, "num_expert_group": 1,
    "topk_group": 1,
}


def _scaled(**changes) -> dict:
    cfg = {**KIMI_LINEAR_48B, **changes}
    return cfg


CONFIGS = {
    "kimi-linear-48b": KIMI_LINEAR_48B,
    # CPU-sized: same structure (KDA/MLA map, dense layer 0, sigmoid MoE), narrow widths
    "small": _scaled(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                     num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, qk_nope_head_dim=32,
                     qk_rope_head_dim=32, v_head_dim=32, num_experts=32, num_experts_per_token=4,
                     moe_intermediate_size=128, model_max_length=4096,
                     linear_attn_config={"head_dim": 32, "num_heads": 4, "short_conv_kernel_size": 4,
                                         "kda_layers": [1, 2, 3, 5, 6, 7], "full_attn_layers": [4, 8]}),
    "tiny": _scaled(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
                    qk_rope_head_dim=16, v_head_dim=16, num_experts=8, num_experts_per_token=2,
                    moe_intermediate_size=32, model_max_length=1024,
                    linear_attn_config={"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                                        "kda_layers": [1, 2, 4], "full_attn_layers": [3]}),
}


def selective_int4(cfg, group_size: int = 32) -> dict[str, int]:
    """Model paths the selective plan stores as INT4 -> group size."""
    return {path: group_size for name, (path, _) in table.expand(cfg).items()
            if policy(name, "selective") == "int4"}


def _fill_plain(name: str, t: torch.Tensor, g: torch.Generator):
    if re.search(r"(layernorm|norm)\.weight$", name):
        t.fill_(1.0)
    elif name.endswith("A_log"):
        t.uniform_(0.0, math.log(16.0), generator=g)
    elif name.endswith(("dt_bias", "e_score_correction_bias")):
        t.normal_(0.0, 0.1, generator=g)
    elif name.endswith("conv1d.weight"):
        t.normal_(0.0, 0.5, generator=g)
    else:  # embedding and router
        t.normal_(0.0, t.shape[-1] ** -0.5 if "gate" in name else 1.0, generator=g)


def _fill_matrix(target, part_of, expert, g: torch.Generator):
    """Dense: N(0, 1/K). INT4: random codes, scales ~ 2.5/(7 sqrt K) (absmax of a Gaussian group), m = -8 s."""
    k = target.shape[1] if isinstance(target, ExpertBank) else target.in_features
    if not target.group_size:
        part_of("weight").normal_(0.0, k ** -0.5, generator=g)
        return
    part_of("qweight").copy_(torch.randint(0, 256, part_of("qweight").shape, generator=g,
                                           device=g.device, dtype=torch.uint8))
    scales = part_of("scales")
    scales.copy_(torch.empty(scales.shape, device=g.device).uniform_(0.5, 1.5, generator=g)
                 * (2.5 / 7 * k ** -0.5))
    part_of("mins").copy_(-8 * scales.float())


def fill_random(model, seed: int = 0):
    """Every slot of the checkpoint table gets plausible random values, generated on the device."""
    g = torch.Generator(device=model.device).manual_seed(seed)
    for name, (path, expert) in table.expand(model.config).items():
        target = table.find(model, path)
        if isinstance(target, torch.Tensor):
            _fill_plain(name, target, g)
        elif isinstance(target, (Linear, ExpertBank)):
            part_of = (lambda p, t=target, e=expert: t.slot(p, e)) if expert is not None else target.slot
            _fill_matrix(target, part_of, expert, g)


def layer_tensors(layer) -> list[torch.Tensor]:
    return weight_tensors(layer)
