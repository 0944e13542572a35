"""Quantizer: selective plan, manifest verification, fail-closed policy, INT4 vs BF16 logits.

The bound on INT4 logits is a noise control: round-to-nearest leaves each weight off by at most
half a step s/2, spread like uniform noise in [-s/2, s/2]. So the INT4 model's logit error must be
of the same size as that of the BF16 model with exactly such noise added to the same matrices
(we allow 1.5x). Routing is made bias-driven (router_scale=0) so an expert flip cannot make the
comparison chaotic. Separately, the INT4 model must equal the fp32 model run on the dequantized
weights, which pins the packed path itself.
"""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support import kimi_tiny  # noqa: E402

from engined.weights import kimi_table as table  # noqa: E402
from engined.weights.kimi_checkpoint import (CheckpointError, build_empty, load_kimi_linear,  # noqa: E402
                                            load_weights, open_checkpoint)
from engined.weights.manifest import VerifyError, verify_artifact  # noqa: E402
from engined.ops import int4_format  # noqa: E402
from engined.weights.quantize import QuantizeError, policy, quantize_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("kq")
    src = kimi_tiny.write_tiny_checkpoint(root / "src", router_scale=0.0)
    manifest = quantize_checkpoint(src, root / "int4", progress=False)
    return src, root / "int4", manifest


def _fp32_model(path):
    ckpt = open_checkpoint(path)
    model = build_empty(ckpt, "cpu", torch.float32, torch.float32)
    load_weights(ckpt, model, progress=False)
    return model


def _logits(model, tokens):
    return model.forward(tokens, model.new_cache(64), 0, last_only=False)


def test_selective_plan_quantizes_exactly_the_listed_classes(pair):
    _, dst, manifest = pair
    quantized = {n.removesuffix(".qweight") for n in manifest["tensors"] if n.endswith(".qweight")}
    assert "model.layers.1.block_sparse_moe.experts.7.w2" in quantized
    assert "model.layers.2.self_attn.kv_b_proj" in quantized and "model.layers.0.mlp.down_proj" in quantized
    kept = {n for n in manifest["tensors"] if not n.endswith((".qweight", ".scales", ".mins"))}
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
                 "model.layers.1.block_sparse_moe.gate.weight", "model.layers.0.self_attn.f_b_proj.weight",
                 "model.layers.0.self_attn.A_log", "model.layers.0.self_attn.q_conv1d.weight"):
        assert name in kept
    # 3 KDA x 4 + 1 MLA x 3 + dense 3 + 3 MoE layers x (8 x 3 + 3 shared)
    assert len(quantized) == 12 + 3 + 3 + 3 * 27
    assert manifest["tensors"]["model.layers.0.self_attn.A_log"]["dtype"] == "F32"
    assert verify_artifact(dst)["quantized"] == len(quantized)


def test_int4_model_equals_fp32_model_on_dequantized_weights(pair):
    src, dst, _ = pair
    tokens = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(1))
    reference = _fp32_model(src)
    for name, (path, expert) in table.expand(reference.config).items():
        if policy(name, "selective") == "int4":
            w = table.slot(reference, path, "weight", expert)
            w.copy_(int4_format.dequantize(int4_format.quantize_sym(w, 32)))
    quantized = load_kimi_linear(dst, progress=False).model
    torch.testing.assert_close(_logits(quantized, tokens), _logits(reference, tokens), atol=1e-4, rtol=1e-4)


def test_int4_logit_error_is_within_rounding_noise_bound(pair):
    src, dst, _ = pair
    tokens = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(2))
    base, noisy = _fp32_model(src), _fp32_model(src)
    g = torch.Generator().manual_seed(3)
    for name, (path, expert) in table.expand(base.config).items():
        if policy(name, "selective") == "int4":
            w = table.slot(noisy, path, "weight", expert)
            step = int4_format.quantize_sym(w, 32).scales.float().repeat_interleave(32, -1)
            w.add_((torch.rand(w.shape, generator=g) - 0.5) * step)
    want = _logits(base, tokens)
    rel = lambda x: ((x - want).norm() / want.norm()).item()  # noqa: E731
    int4_err = rel(_logits(load_kimi_linear(dst, progress=False).model, tokens))
    noise_err = rel(_logits(noisy, tokens))
    assert 0 < int4_err <= 1.5 * noise_err, (int4_err, noise_err)


def test_verify_detects_tampering(pair, tmp_path):
    _, dst, _ = pair
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in dst.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert verify_artifact(copy)["rehashed"]
    shard = sorted(copy.glob("*.safetensors"))[-1]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01                                             # same size, one bit flipped
    shard.write_bytes(bytes(raw))
    with pytest.raises(VerifyError, match="sha256"):
        verify_artifact(copy)
    with pytest.raises(VerifyError, match="sha256"):
        load_kimi_linear(copy, progress=False)
    (copy / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(VerifyError, match="not in the manifest"):
        verify_artifact(copy, rehash=False)


def test_manifest_edit_is_caught(pair, tmp_path):
    _, dst, _ = pair
    copy = tmp_path / "m"
    copy.mkdir()
    for f in dst.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((copy / "kimi-int4.json").read_text())
    name = next(iter(manifest["tensors"]))
    manifest["tensors"][name]["shape"] = [1]
    (copy / "kimi-int4.json").write_text(json.dumps(manifest))
    with pytest.raises(VerifyError, match="differ from the manifest"):
        verify_artifact(copy)


def test_selective_plan_fails_closed_on_unknown_matrix(tmp_path):
    src = kimi_tiny.write_tiny_checkpoint(tmp_path / "src", num_shards=1)
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(str(shard))
    tensors["model.layers.1.self_attn.mystery_proj.weight"] = torch.zeros(64, 64).bfloat16()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(QuantizeError, match="no quantization policy.*mystery_proj"):
        quantize_checkpoint(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(QuantizeError, match="no quantization policy"):
        policy("model.layers.0.self_attn.new_gate.weight", "selective")


def test_plan_none_and_refusals(tmp_path):
    src = kimi_tiny.write_tiny_checkpoint(tmp_path / "src", num_shards=1)
    manifest = quantize_checkpoint(src, tmp_path / "bf16", plan="none", progress=False)
    assert not any(n.endswith(".qweight") for n in manifest["tensors"])
    assert load_kimi_linear(tmp_path / "bf16", progress=False).model.weight_bytes == \
        load_kimi_linear(src, progress=False).model.weight_bytes
    with pytest.raises(QuantizeError, match="already exists"):
        quantize_checkpoint(src, tmp_path / "bf16", progress=False)
    with pytest.raises(QuantizeError, match="already a kimi-local INT4"):
        quantize_checkpoint(tmp_path / "bf16", tmp_path / "again", progress=False)
    with pytest.raises(QuantizeError, match="plan"):
        quantize_checkpoint(src, tmp_path / "x", plan="some", progress=False)


def test_plan_all_runs_int4_lm_head_and_low_rank_projections(tmp_path):
    src = kimi_tiny.write_tiny_checkpoint(tmp_path / "src", num_shards=1)
    manifest = quantize_checkpoint(src, tmp_path / "all", plan="all", group_size=16, progress=False)
    for stem in ("lm_head", "model.layers.0.self_attn.f_b_proj", "model.layers.2.self_attn.kv_a_proj_with_mqa"):
        assert stem + ".qweight" in manifest["tensors"]
    reference = _fp32_model(src)
    for name, (path, expert) in table.expand(reference.config).items():
        if policy(name, "all") == "int4":
            w = table.slot(reference, path, "weight", expert)
            w.copy_(int4_format.dequantize(int4_format.quantize_sym(w, 16)))
    quantized = load_kimi_linear(tmp_path / "all", progress=False).model
    assert quantized.lm_head.is_int4
    tokens = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_logits(quantized, tokens), _logits(reference, tokens), atol=1e-4, rtol=1e-4)


def test_cli_quantize_verify_and_clear_errors(tmp_path):
    from click.testing import CliRunner
    from engined.commands.kimi import quantize, verify
    src = kimi_tiny.write_tiny_checkpoint(tmp_path / "src", num_shards=1)
    runner = CliRunner()
    done = runner.invoke(quantize, [str(src), str(tmp_path / "q"), "--quiet"])
    assert done.exit_code == 0 and "99 INT4 matrices" in done.output, done.output
    done = runner.invoke(verify, [str(tmp_path / "q")])
    assert done.exit_code == 0 and done.output.startswith("OK ")
    (tmp_path / "q" / "config.json").write_text("{}")
    done = runner.invoke(verify, [str(tmp_path / "q")])
    assert done.exit_code == 1 and "config.json: size" in done.output and "Traceback" not in done.output
    done = runner.invoke(quantize, [str(tmp_path / "q"), str(tmp_path / "q2")])
    assert done.exit_code == 1 and "Error:" in done.output and "Traceback" not in done.output


def _copy_artifact(dst, to):
    to.mkdir()
    for f in dst.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


def _rewrite_shard_metadata(path, **changes):
    """Edit a safetensors header's __metadata__ in place (None deletes a key)."""
    import struct
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    meta = header["__metadata__"]
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


def _reseal(path, manifest):
    """Re-hash the files into a fresh manifest: a consistent artifact with the edits kept."""
    from engined.weights.manifest import write_manifest
    return write_manifest(path, manifest["plan"], manifest["group_size"], manifest["tensors"])


def _quantized_shard(path) -> tuple:
    from engined.weights.shards import read_header
    for shard in sorted(path.glob("*.safetensors")):
        stems = [n.removesuffix(".qweight") for n in read_header(shard).tensors if n.endswith(".qweight")]
        if stems:
            return shard, stems[0]
    raise AssertionError("no quantized shard")


def test_quantized_linears_are_symmetric_scales_only(pair):
    """Format version 2: the quantizer writes each linear's scheme, and no mins."""
    from engined.weights.shards import read_header
    _, dst, manifest = pair
    assert manifest["format_version"] == "2"
    assert not any(n.endswith(".mins") for n in manifest["tensors"])
    summary = verify_artifact(dst, rehash=False)
    assert summary["symmetric"] == summary["quantized"] == 99
    for shard in dst.glob("*.safetensors"):
        header = read_header(shard)
        for name in header.tensors:
            if name.endswith(".qweight"):
                stem = name.removesuffix(".qweight")
                assert header.meta[stem + ".scheme"] == "symmetric"
                assert header.meta[stem + ".group_size"] == "32"
    model = load_kimi_linear(dst, progress=False).model
    assert model.layers[0].mlp.gate_proj.mins is None
    assert model.layers[1].block_sparse_moe.w1.mins is None


def test_verify_checks_each_linears_recorded_scheme(pair, tmp_path):
    _, dst, manifest = pair
    for i, (change, message) in enumerate([
            ("asymmetric", "recorded asymmetric but lacks"),
            (None, "scheme None in metadata"),
            ("lopsided", "scheme 'lopsided'")]):
        copy = _copy_artifact(dst, tmp_path / f"c{i}")
        shard, stem = _quantized_shard(copy)
        _rewrite_shard_metadata(shard, **{stem + ".scheme": change})
        _reseal(copy, manifest)
        with pytest.raises(VerifyError, match=message):
            verify_artifact(copy)


def test_version_1_artifact_is_refused_with_a_re_quantize_message(pair, tmp_path):
    """Version 1 (an fp16 min for every group) is refused, not guessed at: re-quantize."""
    _, dst, manifest = pair
    copy = _copy_artifact(dst, tmp_path / "v1")
    for shard in copy.glob("*.safetensors"):
        _rewrite_shard_metadata(shard, **{int4_format.VERSION_KEY: "1"})
    sealed = _reseal(copy, manifest)
    sealed["format_version"] = "1"
    (copy / "kimi-int4.json").write_text(json.dumps(sealed))
    with pytest.raises(VerifyError, match=r"version '1' is not kimi-packed-int4 v2; re-quantize"):
        verify_artifact(copy)
    with pytest.raises(CheckpointError, match=r"version '1' is not supported .*re-quantize"):
        load_kimi_linear(copy, progress=False)
