"""Quantizer: selective plan, manifest verification, fail-closed policy, INT4 vs BF16 logits.

The bound on INT4 logits is a noise control: round-to-nearest leaves each weight off by at most
half a step s/2, spread like uniform noise in [-s/2, s/2]. So the INT4 model's logit error must be
of the same size as that of the BF16 model with exactly such noise added to the same matrices
(we allow 1.5x). Routing is made bias-driven (router_scale=0) so an expert flip cannot make the
comparison chaotic. Separately, the INT4 model must equal the fp32 model run on the dequantized
weights, which pins the packed path itself.

Expected codes, scales and the noise step all come from hand_quantized below: a plain
round-to-nearest written from the format's definition, sharing no code with quantize_sym.
"""
import json

import numpy as np
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


def hand_quantized(w: torch.Tensor, group: int) -> tuple[np.ndarray, np.ndarray]:
    """The oracle: symmetric INT4 as int4_format's docstring defines it. Per group of `group`
    weights, s = absmax / 7 rounded to fp16 (1 for a group of zeros) and c = the integer nearest
    w / s, in -7..7 (stored q = c + 8); a tie (w / s halfway, which bf16 weights do hit) goes to
    the even integer, as IEEE round-to-nearest does. In float64, where a bf16 w and an fp16 s
    are exact. -> codes c [N, K], scales s [N, K/G]."""
    n, k = w.shape
    x = w.double().numpy().reshape(n, k // group, group)
    absmax = np.abs(x).max(axis=-1)
    s = np.where(absmax > 0, absmax / 7, 1.0).astype(np.float16).astype(np.float64)
    ratio = x / s[..., None]
    below = np.floor(ratio)
    frac = ratio - below
    c = below + (frac > 0.5) + ((frac == 0.5) & (below % 2 == 1))
    return np.clip(c, -7, 7).reshape(n, k).astype(np.int64), s


def hand_dequantized(w: torch.Tensor, group: int) -> torch.Tensor:
    """s * c: the weight the oracle's codes and scales stand for, fp32 [N, K]."""
    c, s = hand_quantized(w, group)
    return torch.from_numpy(np.repeat(s, group, axis=1) * c).float()


def assert_hand_quantized(w: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                          group: int, name: str = "quantize_sym") -> None:
    """qweight [N, K/2] (element 2j in the low nibble) and scales [N, K/G] are the oracle's,
    and every weight is within half a step of its code: |w - s * (q - 8)| <= s / 2."""
    want_c, want_s = hand_quantized(w, group)
    got_s = scales.double().numpy()
    assert np.array_equal(got_s, want_s), f"{name}: scales {got_s} != {want_s}"
    b = qweight.numpy().astype(np.int64)
    q = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], -1)
    assert q.min() >= 1 and q.max() <= 15, f"{name}: codes outside 1..15 (c in -7..7)"
    c = q - 8
    wrong = c != want_c
    assert not wrong.any(), (f"{name}: {int(wrong.sum())} codes not round-to-nearest, first at "
                             f"{np.argwhere(wrong)[0].tolist()}: {c[wrong][0]} for {want_c[wrong][0]}")
    x, step = w.double().numpy(), np.repeat(got_s, group, axis=1)
    assert (np.abs(x - step * c) <= step / 2).all(), f"{name}: off by more than half a step"


def assert_artifact_hand_quantized(src, dst, group: int) -> int:
    """Every INT4 linear the quantizer wrote to `dst` is the oracle's from its `src` weight."""
    source = {n: t for f in src.glob("*.safetensors") for n, t in load_file(str(f)).items()}
    written = {n: t for f in dst.glob("*.safetensors") for n, t in load_file(str(f)).items()}
    stems = [n.removesuffix(".qweight") for n in written if n.endswith(".qweight")]
    for stem in stems:
        assert_hand_quantized(source[stem + ".weight"], written[stem + ".qweight"],
                              written[stem + ".scales"], group, stem)
    return len(stems)


def awkward_weights(group: int) -> torch.Tensor:
    """bf16 rows of groups: random at three magnitudes, zeros, one nonzero, a negative absmax,
    and exact ties (absmax 7: s = 1, so w = 2.5 sits halfway between codes 2 and 3)."""
    gen = torch.Generator().manual_seed(group)
    rows = [torch.randn(4 * group, generator=gen) * scale for scale in (1e-3, 0.02, 30.0)]
    ties = torch.tensor([7.0, 2.5, -2.5, 0.5, -0.5, 6.5, -6.5, 3.5] + [0.0] * (group - 8))
    one = torch.zeros(group)
    one[group // 2] = -0.3
    negative = torch.randn(group, generator=gen) * 0.1
    negative[3] = -4.0
    rows.append(torch.cat([torch.zeros(group), one, negative, ties]))
    return torch.stack(rows).bfloat16()


@pytest.mark.parametrize("group", [32, 16])
def test_quantize_sym_is_the_hand_written_round_to_nearest(group):
    w = awkward_weights(group)
    packed = int4_format.quantize_sym(w, group)
    assert packed.symmetric and packed.group_size == group
    assert_hand_quantized(w, packed.qweight, packed.scales, group)
    c, s = hand_quantized(w, group)
    assert c[3, -group:][:8].tolist() == [7, 2, -2, 0, 0, 6, -6, 4]  # the ties, to even
    assert s[3, 0] == 1.0 and (c[3, :group] == 0).all()  # a group of zeros: scale 1, codes 0


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


def test_the_artifact_holds_the_hand_written_codes(pair):
    src, dst, _ = pair
    assert assert_artifact_hand_quantized(src, dst, 32) == 99


def test_int4_model_equals_fp32_model_on_dequantized_weights(pair):
    src, dst, _ = pair
    tokens = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(1))
    reference = _fp32_model(src)
    for name, (path, expert) in table.expand(reference.config).items():
        if policy(name, "selective") == "int4":
            w = table.slot(reference, path, "weight", expert)
            w.copy_(hand_dequantized(w, 32))
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
            step = torch.from_numpy(hand_quantized(w, 32)[1]).float().repeat_interleave(32, -1)
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
            w.copy_(hand_dequantized(w, 16))
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
    assert assert_artifact_hand_quantized(src, tmp_path / "q", 32) == 99
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
