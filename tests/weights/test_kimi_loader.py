"""Loader: tiny real-format checkpoint -> model that matches an independent reference forward;
plans from headers only; refuses malformed or foreign checkpoints with clear errors."""
import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.weights import kimi_reference  # noqa: E402
from tests.support import kimi_tiny  # noqa: E402

from engined.weights.kimi_checkpoint import CheckpointError, load_kimi_linear, plan_kimi_linear  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "tiny", num_shards=3)


def _weights(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_loaded_model_matches_reference_forward(tiny):
    loaded = load_kimi_linear(tiny, progress=False)
    cfg = json.loads((tiny / "config.json").read_text())
    tokens = torch.tensor(loaded.tokenizer.encode("hello world, the weather in Paris"))
    want = kimi_reference.forward(_weights(tiny), cfg, tokens)
    got = loaded.model.forward(tokens, loaded.model.new_cache(64), 0, last_only=False)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
    assert loaded.context_length == 512 and loaded.source == tiny


def test_prefill_then_decode_equals_full_prefill(tiny):
    model = load_kimi_linear(tiny, progress=False).model
    tokens = torch.randint(0, 300, (75,), generator=torch.Generator().manual_seed(0))
    full = model.forward(tokens, model.new_cache(80), 0, last_only=False)
    cache = model.new_cache(80)
    rows = [model.forward(tokens[:66], cache, 0, last_only=False)]
    rows += [model.forward(tokens[i:i + 1], cache, i) for i in range(66, 75)]
    torch.testing.assert_close(torch.cat(rows), full, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="can only continue at position 75"):
        model.forward(tokens[:1], cache, 3)


def test_plan_reads_headers_only_and_matches_the_loaded_model(tiny, tmp_path):
    plan = plan_kimi_linear(tiny)
    model = load_kimi_linear(tiny, progress=False).model
    assert plan.weight_bytes == model.weight_bytes + model.state_bytes
    assert plan.kv_bytes_per_token == 1 * (32 + 8) * 4          # one MLA layer, latent + rope, fp32
    assert plan.total_bytes(100) == plan.weight_bytes + 100 * plan.kv_bytes_per_token
    hollow = _copy(tiny, tmp_path / "hollow")
    for shard in hollow.glob("*.safetensors"):                  # keep the header, drop the data
        raw = shard.read_bytes()
        shard.write_bytes(raw[:8 + int.from_bytes(raw[:8], "little")])
    assert plan_kimi_linear(hollow) == plan
    with pytest.raises(CheckpointError, match="file ends inside"):
        load_kimi_linear(hollow, progress=False)


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _rewrite_shard(path, edit, metadata=None):
    shard = sorted(path.glob("*.safetensors"))[0]
    tensors = load_file(str(shard))
    edit(tensors)
    save_file(tensors, str(shard), metadata=metadata or {"format": "pt"})
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != shard.name}
    index["weight_map"].update({n: shard.name for n in tensors})
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def _first_layer_q(t):
    return next(n for n in t if n.endswith("self_attn.q_proj.weight"))


@pytest.mark.parametrize("edit, metadata, message", [
    (lambda t: t.pop(_first_layer_q(t)), None, "lacks 1 tensors"),
    (lambda t: t.update({"model.layers.0.self_attn.rotary.weight": torch.zeros(2)}), None, "no place"),
    (lambda t: t.update({_first_layer_q(t): torch.zeros(3, 3).bfloat16()}), None, "shape"),
    (lambda t: None, {"format": "mlx"}, "unknown safetensors format"),
    (lambda t: t.update({"model.layers.0.self_attn.q_proj.qweight": torch.zeros(2, 2, dtype=torch.uint8)}),
     None, "without a kimi-int4.json"),
])
def test_malformed_checkpoints_are_refused(tiny, tmp_path, edit, metadata, message):
    bad = _copy(tiny, tmp_path / "bad")
    _rewrite_shard(bad, edit, metadata)
    with pytest.raises(CheckpointError, match=message):
        plan_kimi_linear(bad)


@pytest.mark.parametrize("change, message", [
    ({"quantization_config": {"bits": 4}}, "foreign quantization"),
    ({"linear_attn_config": {"head_dim": 16, "num_heads": 4, "kda_layers": [1, 2, 3, 4],
                             "full_attn_layers": [3]}}, "exactly one"),
    ({"model_type": "llama"}, "kimi_linear"),
    ({"q_lora_rank": 64}, "q_lora_rank"),
])
def test_bad_configs_are_refused(tiny, tmp_path, change, message):
    bad = _copy(tiny, tmp_path / "badcfg")
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(change)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message):
        plan_kimi_linear(bad)


KDA_48B = [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26]
MLA_48B = [4, 8, 12, 16, 20, 24, 27]


def kimi_48b_config() -> dict:
    return kimi_tiny.tiny_config(
        163_584, hidden_size=2304, intermediate_size=9216, num_hidden_layers=27, num_attention_heads=32,
        num_key_value_heads=32, head_dim=72, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, num_experts=256, num_experts_per_token=8, moe_intermediate_size=1024,
        model_max_length=1_048_576, linear_attn_config={
            "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
            "kda_layers": KDA_48B, "full_attn_layers": MLA_48B})


def test_full_size_header_contract_plan_and_selective_policy(tmp_path):
    """The real 48B shapes (§1, §3) as header-only shards: the table accepts all 20,493 tensors,
    the plan adds up, and the selective policy picks exactly §5.2's 20,150 matrices."""
    from engined.weights.kimi_checkpoint import open_checkpoint
    from engined.weights.quantize import plan_tensors
    cfg = kimi_48b_config()
    path = tmp_path / "k48"
    assert kimi_tiny.write_header_only(path, cfg) == 98_245_528_576          # §3.7 total bytes
    ckpt = open_checkpoint(path)
    assert len(ckpt.names) == 20_493
    plan = plan_kimi_linear(path, device="cuda")                            # bf16 activations
    state = 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 3 * 2)
    assert plan.kv_bytes_per_token == 8_064 and plan.context_length == 1_048_576
    assert plan.weight_bytes == 98_245_528_576 + (15_335_424 + 6_656) * 2 + state  # router, bias fp32
    decisions = plan_tensors(ckpt.headers, "selective", 32)
    assert sum(d == "int4" for d in decisions.values()) == 20_150


def test_full_size_int4_artifact_is_planned_at_26_8_gib(tmp_path):
    """Format version 2 (issue 12): the selective plan's symmetric linears store codes and
    scales only. The 48B artifact plans at 28,803,304,448 bytes = 26.83 GiB (version 1, with an
    fp16 min per group: 31,822,531,584 = 29.64 GiB); the memory plan of the loaded model is
    that plus the router held in fp32."""
    from engined.models.kimi_linear import KimiLinearModel
    from engined.weights.kimi_checkpoint import open_checkpoint
    from engined.weights.quantize import plan_tensors, planned_bytes
    from engined.weights.synthetic import selective_int4
    path = tmp_path / "k48"
    kimi_tiny.write_header_only(path, kimi_48b_config())
    ckpt = open_checkpoint(path)
    planned = planned_bytes(ckpt.headers, "selective", 32)
    assert planned == 28_803_304_448 and planned / 2**30 <= 27.0
    decisions = plan_tensors(ckpt.headers, "selective", 32)
    int4_params = sum(shape[0] * shape[1] for h in ckpt.headers.values()
                      for name, (_, shape) in h.tensors.items() if decisions[name] == "int4")
    assert int4_params == 48_307_634_176
    assert planned + int4_params // 16 == 31_822_531_584  # what version 1's mins added
    model = KimiLinearModel(ckpt.config, torch.bfloat16, "meta", selective_int4(ckpt.config),
                            torch.bfloat16)
    assert model.weight_bytes == planned + (15_335_424 + 6_656) * 2  # router and its bias in fp32


def test_tied_embeddings_share_one_tensor(tmp_path):
    path = kimi_tiny.write_tiny_checkpoint(tmp_path / "tied", num_shards=1, tie_word_embeddings=True)
    shard = next(path.glob("*.safetensors"))
    tensors = load_file(str(shard))
    del tensors["lm_head.weight"]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (path / "model.safetensors.index.json").unlink()
    model = load_kimi_linear(path, progress=False).model
    assert model.lm_head.weight is model.embed_tokens
    tokens = torch.tensor([5, 6, 7])
    want = kimi_reference.forward({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]},
                                  json.loads((path / "config.json").read_text()), tokens)
    torch.testing.assert_close(model.forward(tokens, model.new_cache(8), 0, last_only=False), want,
                               atol=2e-4, rtol=1e-4)
