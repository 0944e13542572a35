"""Random Kimi-Linear weights made directly on the device, through the checkpoint table: the
synthetic benchmark, and the `synthetic:NAME` model source that serves them (`kimi-engine
serve --model synthetic:small`) so the served path can be measured with no 30 GiB file.
CONFIGS holds the real 48B config.json (reference §1.1) and small ones."""
import math
import pathlib
import re

import torch

from engined.weights import kimi_table as table
from engined.weights.quant_policy import policy
from engined.layers.linear import Linear
from engined.layers.moe import ExpertBank
from engined.models.kimi_linear import KimiLinearModel, weight_tensors
from engined.models.kimi_linear_config import parse_config
from engined.ops.int4_format import Int4Layout
from engined.weights.plan import LoadedModel, LoadPlan

PREFIX = "synthetic:"
# K2's special tokens by offset after the BPE ranks (tokenizer_config.json's added tokens).
K2_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
               6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
               11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
               13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
               15: "<|tool_call_end|>", 17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]"}

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
    # The 48B's 27 layers (its KDA/MLA map, dense layer 0, 26 MoE layers of top-8) at tiny
    # widths: the step the kernel counter walks (bench/kernel_count.py), in seconds on a CPU.
    "kimi-linear-48b-tiny": _scaled(vocab_size=512, hidden_size=64, intermediate_size=96,
                                    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
                                    qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                                    num_experts=16, moe_intermediate_size=32, model_max_length=1024,
                                    linear_attn_config={**KIMI_LINEAR_48B["linear_attn_config"],
                                                        "head_dim": 16, "num_heads": 4}),
}


def selective_int4(cfg, group_size: int = 32) -> dict[str, Int4Layout]:
    """Model paths the selective plan stores as INT4 -> layout: symmetric, as
    `kimi-engine quantize` writes them (scales only, no mins)."""
    layout = Int4Layout(group_size, symmetric=True)
    return {path: layout for name, (path, _) in table.expand(cfg).items()
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
    """Dense: N(0, 1/K). INT4: random codes, scales ~ 2.5/(7 sqrt K) (absmax of a Gaussian group);
    an asymmetric bank gets m = -8 s, the same weights a symmetric one has."""
    k = target.shape[1] if isinstance(target, ExpertBank) else target.in_features
    if not target.group_size:
        part_of("weight").normal_(0.0, k ** -0.5, generator=g)
        return
    part_of("qweight").copy_(torch.randint(0, 256, part_of("qweight").shape, generator=g,
                                           device=g.device, dtype=torch.uint8))
    scales = part_of("scales")
    scales.copy_(torch.empty(scales.shape, device=g.device).uniform_(0.5, 1.5, generator=g)
                 * (2.5 / 7 * k ** -0.5))
    if target.mins is not None:
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


class UnknownSynthetic(ValueError):
    """synthetic:NAME names no config of CONFIGS."""


def is_synthetic(spec: str) -> bool:
    return spec.startswith(PREFIX)


def config_of(spec: str) -> dict:
    name = spec.removeprefix(PREFIX)
    if name not in CONFIGS:
        raise UnknownSynthetic(f"model {spec!r}: no synthetic config {name!r} "
                         f"(known: {', '.join(PREFIX + n for n in CONFIGS)})")
    return CONFIGS[name]


def build(cfg: dict, device, int4: bool = True, seed: int = 0, fill: bool = True,
          offload: frozenset[int] = frozenset(), cache_slots: int = 0,
          act_device=None) -> KimiLinearModel:
    """The model with random weights on `device`: bf16 activations on CUDA (or act_device's:
    a plan on the meta device sizes what that device will hold), fp32 elsewhere;
    int4: the selective plan (routed and shared experts packed), else dense bf16; offload:
    MoE layers whose routed experts are made in RAM (the same values, seed for seed);
    cache_slots: the device's expert cache for them (layers/expert_cache.py)."""
    config = parse_config(cfg)
    dtype = torch.bfloat16 if torch.device(act_device or device).type == "cuda" else torch.float32
    model = KimiLinearModel(config, dtype, device, selective_int4(config) if int4 else {},
                            torch.bfloat16, offload, cache_slots)
    if fill:
        fill_random(model, seed)
        model.settle_on_device_()
    return model


def plan(spec: str, device="cpu") -> LoadPlan:
    """From shapes alone (the model is planned on the meta device)."""
    from engined.weights.placement import model_parts

    model = build(config_of(spec), "meta", fill=False, act_device=device)
    return LoadPlan(model.weight_bytes + model.state_bytes, model.kv_bytes_per_token,
                    model.config.context_length, model_parts(model))


def byte_tokenizer(vocab_size: int):
    """A tokenizer with exactly `vocab_size` ids, so every id random weights sample decodes:
    the 256 bytes, then byte pairs and triples in order, then K2's 256 reserved specials. Enough
    for the real chat format, output parser and decoders (the text is noise; the speed is
    what is measured)."""
    import itertools

    from engined.chat.kimi_tokenizer import NUM_RESERVED, KimiTokenizer

    num_bpe = vocab_size - NUM_RESERVED
    if num_bpe < 256:
        raise UnknownSynthetic(f"a vocabulary of {vocab_size} cannot hold the 256 bytes and "
                               f"{NUM_RESERVED} specials")
    pieces = itertools.chain(itertools.product(range(256), repeat=1),
                             itertools.product(range(256), repeat=2),
                             itertools.product(range(256), repeat=3))
    ranks = {bytes(p): i for i, p in zip(range(num_bpe), pieces)}
    names = {num_bpe + offset: name for offset, name in K2_SPECIALS.items()}
    return KimiTokenizer(ranks, names, "[BOS]", "[EOS]")


def load(spec: str, device="cpu", threads: int | None = None,
         offload: frozenset[int] = frozenset(), cache_slots: int = 0) -> LoadedModel:
    from engined.chat.kimi_template import KimiChatFormat

    if threads is not None:
        torch.set_num_threads(threads)
    cfg = config_of(spec)
    tokenizer = byte_tokenizer(cfg["vocab_size"])
    model = build(cfg, device, offload=offload, cache_slots=cache_slots)
    return LoadedModel(spec, model, tokenizer, KimiChatFormat(None, tokenizer),
                       model.config.context_length, pathlib.Path(spec), model.offload_counters)
