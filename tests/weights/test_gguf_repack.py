"""GGUF -> packed-INT4 repack: bit-exact against gguf-py's own dequantizer (the independent
reference), the q/k un-permute, the sha256-keyed cache, and refusal of bad artifacts."""
import json
import pathlib
import struct

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from safetensors import safe_open

from engined.weights import artifact
from engined.weights import gguf_repack
from engined.weights import loader
from engined.layers.embedding import dequantize_q8_0
from engined.ops import int4_format as fmt
from tests.weights.gguf_helpers import write_tiny_llama

Q4_1, Q8_0 = GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0


def test_q4_1_block_reorder_known_answer():
    # engined/ops/README.md: codes q_i = i mod 16, d = 0.5, m = -4.
    block = np.zeros(20, dtype=np.uint8)
    block[0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    block[2:4] = np.frombuffer(np.float16(-4.0).tobytes(), np.uint8)
    block[4:] = [i | i << 4 for i in range(16)]
    p = gguf_repack.repack_q4_1(block[None])
    ours = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
    assert p.qweight.tolist() == [ours * 2]
    assert p.scales.tolist() == [[0.5]] and p.mins.tolist() == [[-4.0]]
    want = [0.5 * (i % 16) - 4 for i in range(32)]
    assert fmt.dequantize(p).tolist() == [want]
    assert gguf_dequantize(block[None], Q4_1).tolist() == [want]


def hf_to_gguf_permute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What convert_hf_to_gguf.py does to q/k rows: per head, split rows into two halves and
    interleave them (row a*hd/2 + b moves to 2b + a)."""
    rows = w.shape[0]
    return w.reshape(num_heads, 2, rows // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("num_heads,head_dim", [(9, 64), (3, 64), (4, 16)])
def test_hf_row_order_undoes_the_gguf_permute(num_heads, head_dim):
    hf = torch.randn(num_heads * head_dim, 8)
    gguf_rows = hf_to_gguf_permute(hf, num_heads)
    assert not torch.equal(gguf_rows, hf)
    assert torch.equal(gguf_rows[gguf_repack.hf_row_order(hf.shape[0], num_heads)], hf)


@pytest.fixture(scope="module")
def default_artifact(default_gguf, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("repack") / "default.safetensors"
    return gguf_repack.repack(default_gguf, out, "test-sha", progress=False)


def reference(tensor, hparams: dict) -> np.ndarray:
    """gguf-py's dequantization, rows put back in HF order for q/k."""
    ref = gguf_dequantize(tensor.data, tensor.tensor_type)
    role = tensor.name.split(".")[-2] if tensor.name.count(".") >= 2 else ""
    if role in gguf_repack.PERMUTED:
        heads = int(hparams[gguf_repack.PERMUTED[role]])
        ref = ref[gguf_repack.hf_row_order(ref.shape[0], heads).numpy()]
    return ref


def test_default_gguf_repack_is_bit_exact(default_gguf, default_artifact):
    reader = GGUFReader(default_gguf)
    hparams = gguf_repack.read_hparams(reader)
    counts = {Q4_1: 0, Q8_0: 0, GGMLQuantizationType.F32: 0}
    with safe_open(default_artifact, "pt") as f:  # safetensors' own reader, not ours
        meta = f.metadata()
        fmt.check_metadata(meta)
        assert json.loads(meta[gguf_repack.HPARAMS_KEY]) == hparams
        for tensor in reader.tensors:
            stem = tensor.name.removesuffix(".weight")
            if tensor.tensor_type == Q4_1:
                assert meta[f"{stem}.group_size"] == "32"
                ours = fmt.dequantize(fmt.from_state_dict(
                    stem, {stem + s: f.get_tensor(stem + s) for s in fmt.SUFFIXES}, meta))
            elif tensor.tensor_type == Q8_0:
                ours = dequantize_q8_0(f.get_tensor(stem + ".q8"), f.get_tensor(stem + ".q8_scales"),
                                       torch.float32)
            else:
                ours = f.get_tensor(tensor.name)
            assert np.array_equal(ours.numpy(), reference(tensor, hparams)), tensor.name
            counts[tensor.tensor_type] += 1
    assert counts == {Q4_1: 210, Q8_0: 1, GGMLQuantizationType.F32: 61}


def test_our_reader_agrees_with_safetensors(default_artifact):
    header = artifact.read_header(default_artifact)
    with artifact.TensorReader(header) as ours, safe_open(default_artifact, "pt") as theirs:
        for name in ("token_embd.q8", "blk.7.attn_k.qweight", "blk.29.ffn_down.mins",
                     "output_norm.weight"):
            assert torch.equal(ours.get(name), theirs.get_tensor(name)), name


def test_cache_builds_once_then_hits(tmp_path, kimi_cache, monkeypatch):
    source = write_tiny_llama(tmp_path / "tiny.gguf")
    first = gguf_repack.cached_artifact(source, progress=False)
    assert first.parent == kimi_cache / "kimi"
    assert first.name.startswith(gguf_repack.file_sha256(source))
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp file left

    def no_repack(*args, **kwargs):
        raise AssertionError("cache miss on the second load")
    monkeypatch.setattr(gguf_repack, "repack", no_repack)
    assert gguf_repack.cached_artifact(source, progress=False) == first


def test_repack_is_format_2_asymmetric_and_a_version_1_cache_is_not_reused(tmp_path, kimi_cache):
    """Q4_1 has mins: every repacked linear is recorded asymmetric. The cache key carries the
    format and repack versions, so a cache written by a version-1 build is never read."""
    source = write_tiny_llama(tmp_path / "tiny.gguf")
    sha = gguf_repack.file_sha256(source)
    old = kimi_cache / "kimi" / f"{sha}.{fmt.FORMAT_NAME}-v1-r1.safetensors"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_bytes(b"a version-1 cache file")
    built = gguf_repack.cached_artifact(source, progress=False)
    assert built != old and built.name.endswith(f"-v2-r{gguf_repack.REPACK_VERSION}.safetensors")
    header = artifact.read_header(built)
    assert header.meta[fmt.VERSION_KEY] == "2" and gguf_repack.REPACK_VERSION == "2"
    stems = [n.removesuffix(".qweight") for n in header.tensors if n.endswith(".qweight")]
    assert stems and all(header.meta[s + ".scheme"] == "asymmetric" and s + ".mins" in header.tensors
                         for s in stems)
    with artifact.TensorReader(header) as reader:
        assert not reader.packed(stems[0]).symmetric


def test_cache_directory_from_systemd_wins(tmp_path, kimi_cache, monkeypatch):
    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "systemd-cache"))
    assert gguf_repack.cache_dir() == tmp_path / "systemd-cache"
    monkeypatch.delenv("CACHE_DIRECTORY")
    assert gguf_repack.cache_dir() == kimi_cache / "kimi"


def rewrite_metadata(path: pathlib.Path, **changes):
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header["__metadata__"].update(changes)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


@pytest.mark.parametrize("damage,message", [
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated"),
    (lambda p: p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all" + b"x" * 64), "not JSON"),
    (lambda p: rewrite_metadata(p, **{fmt.FORMAT_KEY: "gptq-int4"}), "not a kimi-packed-int4"),
    (lambda p: rewrite_metadata(p, **{fmt.VERSION_KEY: "99"}), "version '99' is not supported"),
    (lambda p: rewrite_metadata(p, **{fmt.VERSION_KEY: "1"}), "version '1' is not supported"),
])
def test_damaged_or_foreign_artifact_is_refused_and_cache_rebuilt(tmp_path, kimi_cache,
                                                                 monkeypatch, damage, message):
    source = write_tiny_llama(tmp_path / "tiny.gguf")
    cached = gguf_repack.cached_artifact(source, progress=False)
    damage(cached)
    with pytest.raises(fmt.FormatError, match=message):
        artifact.read_header(cached)
    rebuilds = []
    real_repack = gguf_repack.repack
    monkeypatch.setattr(gguf_repack, "repack", lambda *a, **k: rebuilds.append(1) or real_repack(*a, **k))
    assert artifact.read_header(gguf_repack.cached_artifact(source, progress=False))
    assert rebuilds == [1]


def test_unsupported_gguf_is_refused_without_leftovers(tmp_path, kimi_cache):
    q4_0 = write_tiny_llama(tmp_path / "q4_0.gguf", linear_type=GGMLQuantizationType.Q4_0)
    with pytest.raises(gguf_repack.RepackError, match="Q4_0"):
        gguf_repack.cached_artifact(q4_0, progress=False)
    assert not (kimi_cache / "kimi").exists() or not any((kimi_cache / "kimi").iterdir())
    with pytest.raises(loader.ModelLoadError, match="Q4_0"):
        loader.plan_model(str(q4_0))
    mamba = write_tiny_llama(tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(loader.ModelLoadError, match="architecture 'mamba'"):
        loader.plan_model(str(mamba))
    with pytest.raises(loader.ModelLoadError, match="not a GGUF"):
        loader.plan_model(__file__)
