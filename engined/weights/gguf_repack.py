"""GGUF (llama architecture) -> packed-INT4 safetensors artifact. Format: engined/ops/README.md.

| GGUF type | artifact tensors                                   | exact? |
|-----------|----------------------------------------------------|--------|
| Q4_1      | <name>.qweight/.scales/.mins (G = 32, asymmetric)  | yes    |
| Q8_0      | <name>.q8 int8 [N, K], <name>.q8_scales fp16 [N, K/32] | yes |
| F32       | <name>.weight fp32                                 | yes    |

attn_q / attn_k rows are un-permuted back to the Hugging Face layout (convert_hf_to_gguf.py
permutes them for llama.cpp's interleaved RoPE), so the model uses rotate-half RoPE.
Hyperparameters (llama.* and general.name) travel in __metadata__["kimi.hparams"] as JSON.
"""
import json
import logging
import os
import pathlib
import struct
import tempfile

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from tqdm import tqdm

from engined.config import cache_dir
from engined.weights import artifact
from engined.weights.hashing import file_sha256
from engined.ops import int4_format

log = logging.getLogger(__name__)

REPACK_VERSION = "2"  # 2: format version 2 (each linear's scheme recorded; Q4_1 is asymmetric)
HPARAMS_KEY = "kimi.hparams"
SOURCE_SHA_KEY = "kimi.source_sha256"
SOURCE_NAME_KEY = "kimi.source_name"
Q4_1_BLOCK = 32
Q4_1_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
Q8_0_BLOCK = 32
Q8_0_BYTES = 34  # fp16 d, 32 int8
PERMUTED = {"attn_q": "llama.attention.head_count", "attn_k": "llama.attention.head_count_kv"}


class RepackError(ValueError):
    """The GGUF holds something this repacker does not handle (architecture, tensor type)."""


def read_hparams(reader: GGUFReader) -> dict:
    """general.* scalars and every llama.* key, as JSON-friendly values."""
    hparams = {}
    for key, field in reader.fields.items():
        if key.startswith("llama.") or key in ("general.architecture", "general.name",
                                               "general.basename", "general.size_label"):
            value = field.contents()
            hparams[key] = value.tolist() if isinstance(value, np.ndarray) else value
    if hparams.get("general.architecture") != "llama":
        raise RepackError(f"architecture {hparams.get('general.architecture')!r} is not supported "
                          "(this build runs llama)")
    scaling = hparams.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise RepackError(f"RoPE scaling {scaling!r} is not supported")
    return hparams


def repack_q4_1(raw: np.ndarray) -> int4_format.PackedInt4:
    """raw: [N, K/32 * 20] uint8 GGUF Q4_1 rows -> PackedInt4 with G = 32, bit-exact."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, Q4_1_BYTES)  # [N, B, 20]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]  # [N, B]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]  # [N, B]
    qs = blocks[..., 4:]  # [N, B, 16]: byte i = element i (low), element i + 16 (high)
    codes = np.concatenate((qs & 0x0F, qs >> 4), axis=-1)  # [N, B, 32] in element order
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # ours: 2j low, 2j+1 high
    return int4_format.PackedInt4(torch.from_numpy(packed.reshape(n, -1)),
                                  torch.from_numpy(d), torch.from_numpy(m), Q4_1_BLOCK)


def split_q8_0(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """raw: [N, K/32 * 34] uint8 GGUF Q8_0 rows -> (int8 [N, K], fp16 scales [N, K/32])."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, Q8_0_BYTES)  # [N, B, 34]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]  # [N, B]
    q = blocks[..., 2:].copy().view(np.int8).reshape(n, -1)  # [N, K]
    return torch.from_numpy(q), torch.from_numpy(d)


def hf_row_order(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row index map undoing convert_hf_to_gguf's q/k permute: hf = gguf[order].

    Within each head, GGUF row 2b + a holds HF row a * head_dim/2 + b (a in {0, 1})."""
    half = num_rows // num_heads // 2
    return torch.arange(num_rows).view(num_heads, half, 2).transpose(1, 2).reshape(-1)


def _unpermute(p: int4_format.PackedInt4, order: torch.Tensor) -> int4_format.PackedInt4:
    return int4_format.PackedInt4(p.qweight[order].contiguous(), p.scales[order].contiguous(),
                                  p.mins[order].contiguous(), p.group_size)


def convert_tensor(name: str, kind, raw: np.ndarray, hparams: dict) -> dict[str, torch.Tensor]:
    """One GGUF tensor (raw: its rows as stored) -> its artifact tensors."""
    stem = name.removesuffix(".weight")
    if kind == GGMLQuantizationType.F32:
        return {name: torch.from_numpy(raw.view(np.float32))}
    if kind == GGMLQuantizationType.Q8_0:
        q, d = split_q8_0(raw)
        return {stem + ".q8": q, stem + ".q8_scales": d}
    packed = repack_q4_1(raw)
    role = stem.rsplit(".", 1)[-1]
    if role in PERMUTED:
        packed = _unpermute(packed, hf_row_order(packed.shape[0], int(hparams[PERMUTED[role]])))
    return int4_format.to_state_dict(stem, packed)


def output_specs(tensor) -> dict[str, tuple[str, list[int]]]:
    """Artifact tensors (safetensors dtype, shape) that `tensor` becomes, before converting it."""
    shape = [int(d) for d in reversed(tensor.shape.tolist())]  # GGUF lists ne0 (K) first
    stem, kind = tensor.name.removesuffix(".weight"), tensor.tensor_type
    if kind == GGMLQuantizationType.F32:
        return {tensor.name: ("F32", shape)}
    if kind not in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_1) or len(shape) != 2:
        raise RepackError(f"{tensor.name}: GGUF type {kind.name} {shape} is not supported "
                          "(Q4_1 and Q8_0 matrices and F32 tensors are)")
    n, k = shape
    if kind == GGMLQuantizationType.Q8_0:
        return {stem + ".q8": ("I8", [n, k]), stem + ".q8_scales": ("F16", [n, k // 32])}
    return {stem + ".qweight": ("U8", [n, k // 2]), stem + ".scales": ("F16", [n, k // 32]),
            stem + ".mins": ("F16", [n, k // 32])}


def _header_bytes(specs: dict[str, tuple[str, list[int]]], meta: dict[str, str]) -> bytes:
    entries, offset = {"__metadata__": meta}, 0
    for name, (dtype, shape) in specs.items():
        nbytes = int(np.prod(shape)) * artifact.DTYPES[dtype].itemsize
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(entries).encode()
    text += b" " * (-len(text) % 8)  # keep tensor data 8-byte aligned
    return struct.pack("<Q", len(text)) + text


def repack(gguf_path: pathlib.Path, out_path: pathlib.Path, source_sha256: str = "",
           progress: bool = True) -> pathlib.Path:
    """Write the artifact for `gguf_path` to `out_path` atomically (tmp file + rename).

    Streams one tensor at a time (source bytes read with plain reads), so memory stays at
    about one tensor's size whatever the model."""
    reader = GGUFReader(gguf_path)
    hparams = read_hparams(reader)
    specs = {tensor.name: output_specs(tensor) for tensor in reader.tensors}
    layouts = {stem.removesuffix(".qweight"): int4_format.Int4Layout(Q4_1_BLOCK)  # Q4_1 has mins
               for spec in specs.values() for stem in spec if stem.endswith(".qweight")}
    meta = int4_format.metadata(layouts)
    meta.update({HPARAMS_KEY: json.dumps(hparams), SOURCE_SHA_KEY: source_sha256,
                 SOURCE_NAME_KEY: gguf_path.name, "kimi.repack_version": REPACK_VERSION})
    flat = {name: spec for tensor_specs in specs.values() for name, spec in tensor_specs.items()}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_path.parent, prefix=out_path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, open(gguf_path, "rb") as src:
            out.write(_header_bytes(flat, meta))
            for tensor in tqdm(reader.tensors, desc=f"repack {gguf_path.name}", unit="tensor",
                               disable=not progress):
                src.seek(tensor.data_offset)
                raw = np.frombuffer(bytearray(src.read(int(tensor.n_bytes))), dtype=np.uint8)
                raw = raw.reshape(tensor.data.shape[0], -1) if len(tensor.data.shape) == 2 else raw
                for name, t in convert_tensor(tensor.name, tensor.tensor_type, raw, hparams).items():
                    if list(t.shape) != flat[name][1]:
                        raise RepackError(f"{name}: produced {list(t.shape)}, planned {flat[name][1]}")
                    out.write(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return out_path



def cache_path(gguf_path: pathlib.Path, sha256: str | None = None) -> pathlib.Path:
    """Where the artifact for this GGUF lives: keyed by the source's sha256 and our versions."""
    sha256 = sha256 or file_sha256(gguf_path)
    return cache_dir() / (f"{sha256}.{int4_format.FORMAT_NAME}-v{int4_format.FORMAT_VERSION}"
                          f"-r{REPACK_VERSION}.safetensors")


def cached_artifact(gguf_path: pathlib.Path, progress: bool = True) -> pathlib.Path:
    """The cached artifact for `gguf_path`, repacked first if missing or unreadable."""
    sha256 = file_sha256(gguf_path)
    path = cache_path(gguf_path, sha256)
    if path.is_file():
        try:
            header = artifact.read_header(path)
            if header.meta.get(SOURCE_SHA_KEY) == sha256:
                return path
        except int4_format.FormatError as exc:
            log.warning("rebuilding cached artifact: %s", exc)
    return repack(gguf_path, path, sha256, progress)
