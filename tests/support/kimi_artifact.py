"""A packed-INT4 Kimi-Linear artifact written straight to disk, GBs in seconds (no BF16 source,
no quantizer): the format `kimi-engine quantize --plan selective` writes (engined/ops/README.md),
with the codes random bytes and the scales plausible fp16 values, so the loader verifies it
like any artifact (manifest sha256s, headers, layouts) and a forward runs finite.

Tensors stream into each shard from two reused random blocks, so writing costs about what the
disk and sha256 cost; nothing of the size of a shard is held in memory."""
import json
import pathlib
import struct

import torch

from engined.ops import int4_format
from engined.weights import manifest as kimi_manifest
from engined.weights.quant_policy import policy
from engined.weights.shards import INDEX
from tests.support import kimi_tiny

GROUP = 32
BLOCK = 1 << 22  # bytes of each reused random block
ST_DTYPE = {torch.uint8: "U8", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}


def plan(cfg: dict) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Artifact tensor name -> (dtype, shape): the selective plan's INT4 linears (symmetric,
    group 32: qweight + scales) and everything else as the BF16 checkpoint has it."""
    out = {}
    for name, (shape, dtype) in kimi_tiny.tensor_shapes(cfg).items():
        if policy(name, "selective") == "int4":
            stem = name.removesuffix(".weight")
            n, k = shape
            out[stem + ".qweight"] = (torch.uint8, (n, k // 2))
            out[stem + ".scales"] = (torch.float16, (n, k // GROUP))
        else:
            out[name] = (torch.float32 if dtype == "F32" else torch.bfloat16, shape)
    return out


class _Blocks:
    """Random bytes and random fp16 scales of the right magnitude, BLOCK bytes each."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.codes = memoryview(torch.randint(0, 256, (BLOCK,), generator=g, dtype=torch.uint8)
                                .numpy().tobytes())
        self.unit = torch.empty(BLOCK // 2).uniform_(0.5, 1.5, generator=g)  # scale / (2.5/7/sqrt K)
        self._scales: dict[int, memoryview] = {}

    def scales(self, k: int) -> memoryview:
        """fp16 scales ~ 2.5/(7 sqrt K), as synthetic.py draws them (absmax of a Gaussian group)."""
        if k not in self._scales:
            self._scales[k] = memoryview((self.unit * (2.5 / 7 * k ** -0.5)).half().numpy().tobytes())
        return self._scales[k]


def _write_repeated(f, block: memoryview, size: int):
    while size > 0:
        f.write(block[:size])
        size -= len(block)


def _write_shard(path: pathlib.Path, tensors: dict, metadata: dict, blocks: _Blocks, seed: int):
    header, offset = {"__metadata__": metadata}, 0
    for name, (dtype, shape) in tensors.items():
        size = dtype.itemsize * int(torch.Size(shape).numel())
        header[name] = {"dtype": ST_DTYPE[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    g = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, (dtype, shape) in tensors.items():
            size = dtype.itemsize * int(torch.Size(shape).numel())
            if name.endswith(".qweight"):
                _write_repeated(f, blocks.codes, size)
            elif name.endswith(".scales"):
                _write_repeated(f, blocks.scales(shape[-1] * GROUP), size)  # [N, K/G]
            else:
                f.write(kimi_tiny._init(name, shape, g, 1.0).to(dtype).contiguous()
                        .view(torch.uint8).numpy().tobytes())


def _split(specs: dict, num_shards: int) -> list[dict]:
    """Shards of about equal bytes; a linear's qweight and scales stay in one shard (its
    metadata records the layout)."""
    sizes = {n: dtype.itemsize * int(torch.Size(shape).numel()) for n, (dtype, shape) in specs.items()}
    per, parts, done = sum(sizes.values()) / num_shards, [{}], 0
    for n, spec in specs.items():
        if done >= per * len(parts) and not n.endswith(".scales"):
            parts.append({})
        parts[-1][n] = spec
        done += sizes[n]
    return parts


def write_artifact(path, cfg_overrides: dict, num_shards: int = 4, seed: int = 0) -> pathlib.Path:
    """config.json, tokenizer files, `num_shards` shards + index, and the kimi-int4.json manifest
    (hashes included) in `path`. Returns path."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    num_bpe = kimi_tiny.write_tiktoken(path / "tiktoken.model")
    cfg = kimi_tiny.tiny_config(num_bpe, **cfg_overrides)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps(kimi_tiny.tokenizer_config(num_bpe)))
    specs = plan(cfg)
    blocks, weight_map, entries = _Blocks(seed), {}, {}
    for s, part in enumerate(_split(specs, num_shards)):
        fname = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
        stems = {n.removesuffix(".qweight") for n in part if n.endswith(".qweight")}
        layouts = {stem: int4_format.Int4Layout(GROUP, symmetric=True) for stem in stems}
        _write_shard(path / fname, part, int4_format.metadata(layouts), blocks, seed + s)
        for n, (dtype, shape) in part.items():
            weight_map[n] = fname
            entries[n] = {"dtype": ST_DTYPE[dtype], "shape": list(shape), "file": fname}
    total = sum((path / f).stat().st_size for f in set(weight_map.values()))
    index = {"metadata": {"total_size": total, "quantization": "kimi-packed-int4",
                          "plan": "selective", "group_size": GROUP}, "weight_map": weight_map}
    (path / INDEX).write_text(json.dumps(index, indent=1))
    kimi_manifest.write_manifest(path, "selective", GROUP, entries)
    return path
