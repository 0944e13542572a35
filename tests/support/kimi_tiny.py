"""A tiny Kimi-Linear checkpoint in the real on-disk format (reference §1, §3, §4), built in tests.

Tensor names below are written out from the reference's §3 tables on purpose, independently of
engined/weights/kimi_table.py, so a wrong row in that table fails the loader tests.
Layers (one-based in config.json): KDA 1, 2, 4; MLA 3. Layer 0 is dense, the rest MoE.
"""
import base64
import collections
import json
import pathlib

import torch
from safetensors.torch import save_file

SAMPLE_TEXT = ("hello world, the weather in Paris is sunny. def add(a, b): return a + b\n"
               "The quick brown fox jumps over the lazy dog. 東京 is in Japan. "
               '{"city": "Paris", "temp_c": 18} get_weather functions.get_weather:0 ') * 4
NUM_MERGES = 64
NUM_RESERVED = 256
# offset from the first special id -> token (§4.2: real ids are 163584 + offset)
SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
            6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
            11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
            13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
            17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]"}


def bpe_ranks(text: str = SAMPLE_TEXT, merges: int = NUM_MERGES) -> list[bytes]:
    """Byte-level BPE trained greedily on `text`: 256 byte tokens, then `merges` merged ones."""
    ranks = [bytes([b]) for b in range(256)]
    words = [[bytes([b]) for b in w.encode()] for w in text.split(" ")]
    for _ in range(merges):
        pairs = collections.Counter(p for w in words for p in zip(w, w[1:]))
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        ranks.append(a + b)
        words = [_merge(w, a, b) for w in words]
    return ranks


def _merge(word, a, b):
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def tiny_config(num_bpe: int, **overrides) -> dict:
    first = num_bpe
    cfg = {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        "dtype": "bfloat16", "torch_dtype": "bfloat16", "vocab_size": num_bpe + NUM_RESERVED,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "bos_token_id": first, "eos_token_id": first + 2,
        "pad_token_id": first + 255, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "rope_scaling": None, "model_max_length": 512, "q_lora_rank": None, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "mla_use_nope": True,
        "linear_attn_config": {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                               "kda_layers": [1, 2, 4], "full_attn_layers": [3]},
        "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
        "moe_intermediate_size": 32, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 2.446, "use_grouped_topk": True, "num_expert_group": 1,
        "topk_group": 1, "num_nextn_predict_layers": 0, "use_cache": True,
    }
    cfg.update(overrides)
    return cfg


def tensor_shapes(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype) for every tensor of a Kimi-Linear checkpoint (§3)."""
    d, lin = cfg["hidden_size"], cfg["linear_attn_config"]
    kda_w, kh, kheads = lin["num_heads"] * lin["head_dim"], lin["head_dim"], lin["num_heads"]
    heads, nope, rope, vd, rank = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"],
                                   cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"])
    mi, ne, si = cfg["moe_intermediate_size"], cfg["num_experts"], cfg["moe_intermediate_size"] * cfg["num_shared_experts"]
    t = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,),
         "lm_head.weight": (cfg["vocab_size"], d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = (d,)
        a = p + "self_attn."
        if i + 1 in lin["kda_layers"]:
            for x in "qkv":
                t[a + f"{x}_proj.weight"], t[a + f"{x}_conv1d.weight"] = (kda_w, d), (kda_w, 1, 4)
            t[a + "f_a_proj.weight"], t[a + "f_b_proj.weight"] = (kh, d), (kda_w, kh)
            t[a + "g_a_proj.weight"], t[a + "g_b_proj.weight"] = (kh, d), (kda_w, kh)
            t[a + "A_log"], t[a + "dt_bias"], t[a + "b_proj.weight"] = (1, 1, kheads, 1), (kda_w,), (kheads, d)
            t[a + "o_norm.weight"], t[a + "o_proj.weight"] = (kh,), (d, kda_w)
        else:
            t[a + "q_proj.weight"], t[a + "kv_a_proj_with_mqa.weight"] = (heads * (nope + rope), d), (rank + rope, d)
            t[a + "kv_a_layernorm.weight"], t[a + "kv_b_proj.weight"] = (rank,), (heads * (nope + vd), rank)
            t[a + "o_proj.weight"] = (d, heads * vd)
        if i < cfg["first_k_dense_replace"]:
            di = cfg["intermediate_size"]
            t[p + "mlp.gate_proj.weight"] = t[p + "mlp.up_proj.weight"] = (di, d)
            t[p + "mlp.down_proj.weight"] = (d, di)
            continue
        m = p + "block_sparse_moe."
        t[m + "gate.weight"], t[m + "gate.e_score_correction_bias"] = (ne, d), (ne,)
        t[m + "shared_experts.gate_proj.weight"] = t[m + "shared_experts.up_proj.weight"] = (si, d)
        t[m + "shared_experts.down_proj.weight"] = (d, si)
        for e in range(ne):
            t[m + f"experts.{e}.w1.weight"] = t[m + f"experts.{e}.w3.weight"] = (mi, d)
            t[m + f"experts.{e}.w2.weight"] = (d, mi)
    return {n: (shape, "F32" if n.endswith(("A_log", "dt_bias")) else "BF16") for n, shape in t.items()}


def _init(name: str, shape, g, router_scale: float) -> torch.Tensor:
    if name.endswith("norm.weight"):
        x = 1 + 0.1 * torch.randn(shape, generator=g)
    elif name.endswith("A_log"):
        return torch.empty(shape).uniform_(0, 2.7, generator=g)
    elif name.endswith("dt_bias"):
        return 0.5 * torch.randn(shape, generator=g)
    elif name.endswith("conv1d.weight"):
        x = 0.5 * torch.randn(shape, generator=g)
    elif name.endswith("e_score_correction_bias"):
        x = 0.1 * torch.randn(shape, generator=g)
    elif name == "model.embed_tokens.weight":
        x = torch.randn(shape, generator=g)
    else:
        x = torch.randn(shape, generator=g) * shape[-1] ** -0.5
        x = x * router_scale if name.endswith("block_sparse_moe.gate.weight") else x
    return x.bfloat16()


def tiny_tensors(cfg: dict, seed: int = 0, router_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """name -> random tensor of tensor_shapes(cfg). router_scale 0 makes routing depend on the
    correction bias alone (no expert flips)."""
    g = torch.Generator().manual_seed(seed)
    return {n: _init(n, shape, g, router_scale) for n, (shape, _) in tensor_shapes(cfg).items()}


def write_header_only(path: pathlib.Path, cfg: dict, num_shards: int = 20) -> int:
    """A checkpoint of `cfg` whose shards hold headers and no data (for planning tests at full
    size). Returns the byte size the data would have."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    specs = list(tensor_shapes(cfg).items())
    per, weight_map, total = -(-len(specs) // num_shards), {}, 0
    for k in range(num_shards):
        fname, header, offset = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors", {}, 0
        for name, (shape, dtype) in specs[k * per:(k + 1) * per]:
            size = (4 if dtype == "F32" else 2) * int(torch.Size(shape).numel())
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = fname
        header["__metadata__"] = {"format": "pt"}
        raw = json.dumps(header).encode()
        (path / fname).write_bytes(len(raw).to_bytes(8, "little") + raw)
        total += offset
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def write_tiktoken(path: pathlib.Path) -> int:
    ranks = bpe_ranks()
    path.write_text("".join(f"{base64.b64encode(tok).decode()} {i}\n" for i, tok in enumerate(ranks)))
    return len(ranks)


def tokenizer_config(num_bpe: int, chat_template: str | None = None) -> dict:
    added = {str(num_bpe + off): {"content": tok, "special": True, "lstrip": False,
                                   "rstrip": False, "normalized": False, "single_word": False}
             for off, tok in SPECIALS.items()}
    cfg = {"added_tokens_decoder": added, "bos_token": "[BOS]", "eos_token": "[EOS]",
           "pad_token": "[PAD]", "unk_token": "[UNK]", "model_max_length": 1048576,
           "tokenizer_class": "TikTokenTokenizer"}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    return cfg


def write_tiny_checkpoint(path, seed: int = 0, num_shards: int = 2, chat_template: str | None = None,
                          router_scale: float = 1.0, **config_overrides) -> pathlib.Path:
    """config.json, model-0000k-of-0000n.safetensors + index, tiktoken.model, tokenizer_config.json."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    num_bpe = write_tiktoken(path / "tiktoken.model")
    cfg = tiny_config(num_bpe, **config_overrides)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(num_bpe, chat_template)))
    tensors = tiny_tensors(cfg, seed, router_scale)
    names = list(tensors)
    per = -(-len(names) // num_shards)
    weight_map, total = {}, 0
    for k in range(num_shards):
        fname = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[k * per:(k + 1) * per]}
        save_file(part, str(path / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
        total += sum(v.numel() * v.element_size() for v in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return path
