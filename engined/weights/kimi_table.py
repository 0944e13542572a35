"""Checkpoint name -> model slot, as a table (reference §3). Everything else is generic lookup.

Each row: (checkpoint name pattern, model path pattern, where). `where` says which layers carry
the tensor: model (once), layer (every layer), kda / mla (attention kind), dense / moe (FFN kind),
expert (every routed expert of a MoE layer; {e} in the name). INT4 artifacts replace
`X.weight` by `X.qweight` / `X.scales` (/ `X.mins` when asymmetric; engined/ops/int4_format.py).
"""
import torch

from engined.layers.linear import SlotError

TABLE = (
    ("model.embed_tokens.weight", "embed_tokens", "model"),
    ("model.norm.weight", "norm.weight", "model"),
    ("lm_head.weight", "lm_head", "model"),
    ("model.layers.{i}.input_layernorm.weight", "layers.{i}.input_layernorm.weight", "layer"),
    ("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attention_layernorm.weight", "layer"),
    ("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.self_attn.q_proj", "kda"),
    ("model.layers.{i}.self_attn.k_proj.weight", "layers.{i}.self_attn.k_proj", "kda"),
    ("model.layers.{i}.self_attn.v_proj.weight", "layers.{i}.self_attn.v_proj", "kda"),
    ("model.layers.{i}.self_attn.q_conv1d.weight", "layers.{i}.self_attn.q_conv1d", "kda"),
    ("model.layers.{i}.self_attn.k_conv1d.weight", "layers.{i}.self_attn.k_conv1d", "kda"),
    ("model.layers.{i}.self_attn.v_conv1d.weight", "layers.{i}.self_attn.v_conv1d", "kda"),
    ("model.layers.{i}.self_attn.f_a_proj.weight", "layers.{i}.self_attn.f_a_proj", "kda"),
    ("model.layers.{i}.self_attn.f_b_proj.weight", "layers.{i}.self_attn.f_b_proj", "kda"),
    ("model.layers.{i}.self_attn.A_log", "layers.{i}.self_attn.A_log", "kda"),
    ("model.layers.{i}.self_attn.dt_bias", "layers.{i}.self_attn.dt_bias", "kda"),
    ("model.layers.{i}.self_attn.b_proj.weight", "layers.{i}.self_attn.b_proj", "kda"),
    ("model.layers.{i}.self_attn.g_a_proj.weight", "layers.{i}.self_attn.g_a_proj", "kda"),
    ("model.layers.{i}.self_attn.g_b_proj.weight", "layers.{i}.self_attn.g_b_proj", "kda"),
    ("model.layers.{i}.self_attn.o_norm.weight", "layers.{i}.self_attn.o_norm.weight", "kda"),
    ("model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.self_attn.o_proj", "layer"),
    ("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.self_attn.q_proj", "mla"),
    ("model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight", "layers.{i}.self_attn.kv_a_proj_with_mqa", "mla"),
    ("model.layers.{i}.self_attn.kv_a_layernorm.weight", "layers.{i}.self_attn.kv_a_layernorm.weight", "mla"),
    ("model.layers.{i}.self_attn.kv_b_proj.weight", "layers.{i}.self_attn.kv_b_proj", "mla"),
    ("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.gate_proj", "dense"),
    ("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.up_proj", "dense"),
    ("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.down_proj", "dense"),
    ("model.layers.{i}.block_sparse_moe.gate.weight", "layers.{i}.block_sparse_moe.gate", "moe"),
    ("model.layers.{i}.block_sparse_moe.gate.e_score_correction_bias",
     "layers.{i}.block_sparse_moe.e_score_correction_bias", "moe"),
    ("model.layers.{i}.block_sparse_moe.shared_experts.gate_proj.weight",
     "layers.{i}.block_sparse_moe.shared_experts.gate_proj", "moe"),
    ("model.layers.{i}.block_sparse_moe.shared_experts.up_proj.weight",
     "layers.{i}.block_sparse_moe.shared_experts.up_proj", "moe"),
    ("model.layers.{i}.block_sparse_moe.shared_experts.down_proj.weight",
     "layers.{i}.block_sparse_moe.shared_experts.down_proj", "moe"),
    ("model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight", "layers.{i}.block_sparse_moe.w1", "expert"),
    ("model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight", "layers.{i}.block_sparse_moe.w3", "expert"),
    ("model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight", "layers.{i}.block_sparse_moe.w2", "expert"),
)
INT4_PART_SUFFIXES = (".qweight", ".scales", ".mins")


def _applies(where: str, cfg, i: int) -> bool:
    return {"layer": True, "kda": i in cfg.kda_layers, "mla": i in cfg.mla_layers,
            "dense": not cfg.is_moe(i), "moe": cfg.is_moe(i), "expert": cfg.is_moe(i)}[where]


def expand(cfg) -> dict[str, tuple[str, int | None]]:
    """Every checkpoint tensor name of this config -> (model path, expert index or None)."""
    out = {}
    for name, path, where in TABLE:
        if where == "model":
            out[name] = (path, None)
            continue
        for i in range(cfg.num_hidden_layers):
            if not _applies(where, cfg, i):
                continue
            experts = range(cfg.num_experts) if where == "expert" else (None,)
            for e in experts:
                out[name.format(i=i, e=e)] = (path.format(i=i), e)
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight")
    return out


def split_part(name: str) -> tuple[str, str]:
    """Artifact tensor name -> (checkpoint name, part): 'X.qweight' -> ('X.weight', 'qweight')."""
    for suffix in INT4_PART_SUFFIXES:
        if name.endswith(suffix):
            return name[:-len(suffix)] + ".weight", suffix[1:]
    return name, "weight"


def find(model, path: str):
    obj = model
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def slot(model, path: str, part: str, expert: int | None) -> torch.Tensor:
    """The preallocated tensor a checkpoint tensor (or one INT4 part of it) is copied into."""
    target = find(model, path)
    if isinstance(target, torch.Tensor):
        if part != "weight":
            raise SlotError(f"{path} is never quantized; the artifact has its {part!r}")
        return target
    return target.slot(part, expert) if expert is not None else target.slot(part)


def int4_paths(names, layouts: dict, table: dict[str, tuple[str, int | None]]) -> dict:
    """Quantized checkpoint names -> {model path: int4_format.Int4Layout}, one layout (group
    size and kind) per expert bank. layouts: name without ".weight" -> its recorded layout."""
    out = {}
    for name in names:
        path, _ = table[name]
        lay = layouts[name.removesuffix(".weight")]
        if out.setdefault(path, lay) != lay:
            raise SlotError(f"{path}: experts quantized with different layouts ({out[path]}, {lay})")
    return out
