"""Kimi-Linear HF checkpoint directories: plan from headers, then stream shards into the model.

A directory holds config.json, *.safetensors (+ model.safetensors.index.json when sharded),
tiktoken.model and tokenizer_config.json. Two formats are accepted: the BF16 HF checkpoint and
our packed-INT4 artifact (engined/weights/quantize.py: kimi-int4.json manifest + kimi.format metadata).
Anything else is refused before a byte of weights is read.
"""
import ctypes
import json
import pathlib
from dataclasses import dataclass

import torch

from engined.weights import kimi_table as table
from engined.weights.manifest import verify_artifact
from engined.weights.plan import LoadedModel, LoadPlan
from engined.weights.shards import INDEX, MANIFEST, ST_DTYPES, CheckpointError, Header, read_header
from engined.layers.linear import SlotError, fill
from engined.models.kimi_linear import KimiLinearModel
from engined.models.kimi_linear_config import DTYPES, ConfigError, KimiLinearConfig, parse_config
from engined.ops import int4_format

@dataclass(frozen=True)
class Checkpoint:
    path: pathlib.Path
    config: KimiLinearConfig
    shards: tuple[pathlib.Path, ...]
    headers: dict[pathlib.Path, Header]
    is_int4: bool
    int4: dict[str, int4_format.Int4Layout]  # model path -> recorded layout (empty for BF16)
    names: dict[str, pathlib.Path]  # artifact tensor name -> shard


def _shards(path: pathlib.Path) -> tuple[pathlib.Path, ...]:
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{INDEX}: unreadable ({exc})") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (path / f).is_file()]
        if missing:
            raise CheckpointError(f"{INDEX} names missing shards: {', '.join(missing)}")
        return tuple(path / f for f in files)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    return tuple(files)


def _read_config(path: pathlib.Path) -> KimiLinearConfig:
    try:
        raw = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}/config.json is not JSON ({exc})") from None
    if raw.get("quantization_config") or raw.get("quantization"):
        raise CheckpointError(f"{path}: config.json declares a foreign quantization "
                              "(only BF16 checkpoints and kimi-local INT4 artifacts load)")
    try:
        return parse_config(raw)
    except ConfigError as exc:
        raise CheckpointError(f"{path}/config.json: {exc}") from None


def _detect_int4(path, headers: dict[pathlib.Path, Header]) -> bool:
    ours = (path / MANIFEST).is_file()
    for shard, h in headers.items():
        fmt = h.meta.get(int4_format.FORMAT_KEY)
        if ours:
            try:
                int4_format.check_metadata(h.meta, shard.name)
            except int4_format.FormatError as exc:
                raise CheckpointError(str(exc)) from None
        elif fmt is not None or h.meta.get("format", "pt") != "pt":
            raise CheckpointError(f"{shard.name}: unknown safetensors format {h.meta!r} "
                                  f"(and no {MANIFEST} manifest)")
        elif any(n.endswith(table.INT4_PART_SUFFIXES) for n in h.tensors):
            raise CheckpointError(f"{shard.name}: packed tensors without a {MANIFEST} manifest")
    return ours


def open_checkpoint(path, rehash: bool = False) -> Checkpoint:
    """Headers and config only: no tensor data is read. An INT4 artifact is checked against its
    manifest (sizes and headers; file hashes too when rehash=True)."""
    path = pathlib.Path(path).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    config = _read_config(path)
    shards = _shards(path)
    headers = {s: read_header(s) for s in shards}
    is_int4 = _detect_int4(path, headers)
    if is_int4:
        verify_artifact(path, rehash=rehash)
    names: dict[str, pathlib.Path] = {}
    for shard, h in headers.items():
        for n in h.tensors:
            if names.setdefault(n, shard) != shard:
                raise CheckpointError(f"tensor {n} appears in {names[n].name} and {shard.name}")
    int4 = {}
    if is_int4:
        quantized = {table.split_part(n)[0] for n in names if n.endswith(".qweight")}
        meta = {k: v for h in headers.values() for k, v in h.meta.items()}
        try:
            layouts = {q.removesuffix(".weight"): int4_format.layout(q.removesuffix(".weight"), meta)
                       for q in quantized}
            int4 = table.int4_paths(quantized, layouts, table.expand(config))
        except KeyError as exc:
            raise CheckpointError(f"quantized tensor without a known slot: {exc}") from None
        except int4_format.FormatError as exc:
            raise CheckpointError(str(exc)) from None
    return Checkpoint(path, config, shards, headers, is_int4, int4, names)


def build_empty(ckpt: Checkpoint, device="cpu", dtype: torch.dtype | None = None,
                weight_dtype: torch.dtype | None = None,
                offload: frozenset[int] = frozenset(), cache_slots: int = 0) -> KimiLinearModel:
    """The model with every weight allocated (untouched) on `device`, the routed experts of
    the `offload` layers in RAM (cache_slots of them cached on the device). dtype: activations (default bf16 on CUDA, fp32 elsewhere);
    dense weights keep the checkpoint dtype unless weight_dtype says otherwise."""
    act = dtype or act_dtype(device)
    wd = weight_dtype or DTYPES[ckpt.config.torch_dtype]
    try:
        return KimiLinearModel(ckpt.config, act, torch.device(device), ckpt.int4, wd, offload,
                               cache_slots)
    except ValueError as exc:  # experts in RAM asked of a BF16 checkpoint
        raise CheckpointError(f"{ckpt.path}: {exc}") from None


def check_contract(ckpt: Checkpoint, model: KimiLinearModel):
    """Every tensor maps to a slot of equal shape and every slot is filled exactly once."""
    expected = table.expand(ckpt.config)
    seen = set()
    for name, shard in ckpt.names.items():
        base, part = table.split_part(name)
        if base not in expected:
            raise CheckpointError(f"{shard.name}: tensor {name} has no place in a Kimi-Linear "
                                  "model of this config")
        try:
            target = table.slot(model, *_path_part(expected, base, part))
        except SlotError as exc:
            raise CheckpointError(f"{name}: {exc}") from None
        shape = ckpt.headers[shard].tensors[name][1]
        if tuple(target.shape) != shape:
            raise CheckpointError(f"{name}: shape {list(shape)} but the config implies "
                                  f"{list(target.shape)}")
        seen.add((base, part))
    missing = [n for n, (path, _) in expected.items()
               if not all((n, p) in seen for p in _parts(path, ckpt.int4))]
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")


def _path_part(expected, base, part):
    path, expert = expected[base]
    return path, part, expert


def _parts(path: str, int4: dict[str, int4_format.Int4Layout]) -> tuple[str, ...]:
    return int4[path].parts if path in int4 else ("weight",)


def act_dtype(device) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def is_kimi_linear_dir(spec) -> bool:
    """True for a directory whose config.json says model_type kimi_linear (loader dispatch)."""
    path = pathlib.Path(str(spec)).expanduser()
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "kimi_linear"
    except (OSError, ValueError, AttributeError):
        return False


def plan_kimi_linear(path, device="cpu"):
    """LoadPlan from headers alone: weight_bytes includes one sequence's fixed KDA state;
    kv_bytes_per_token is the MLA latent cache (R+P per MLA layer, activation dtype); parts
    are what expert placement plans with."""
    from engined.weights.placement import model_parts

    ckpt = open_checkpoint(path)
    model = build_empty(ckpt, "meta", act_dtype(device))
    check_contract(ckpt, model)
    return LoadPlan(model.weight_bytes + model.state_bytes, model.kv_bytes_per_token,
                    ckpt.config.context_length, model_parts(model))


def _read_into(f, name: str, header: Header, slot: torch.Tensor):
    """Read one tensor's bytes from the open shard straight into its slot when the slot is CPU
    memory of the same dtype (no second copy); otherwise via one CPU buffer of that tensor."""
    dtype_name, shape = header.tensors[name]
    begin, end = header.spans[name]
    if dtype_name not in ST_DTYPES:
        raise CheckpointError(f"{name}: dtype {dtype_name} is not supported")
    dtype = ST_DTYPES[dtype_name]
    want = dtype.itemsize * int(torch.Size(shape).numel())
    if end - begin != want:
        raise CheckpointError(f"{name}: {end - begin} bytes on disk, {want} expected for {dtype_name} {list(shape)}")
    if tuple(slot.shape) != tuple(shape):
        raise SlotError(f"{name}: checkpoint shape {list(shape)} != model shape {list(slot.shape)}")
    direct = slot.device.type == "cpu" and slot.dtype == dtype and slot.is_contiguous()
    target = slot if direct else torch.empty(shape, dtype=dtype)
    f.seek(begin)
    if f.readinto(_bytes_of(target)) != want:
        raise CheckpointError(f"{name}: file ends inside the tensor's data")
    if not direct:
        fill(slot, target, name)


def _bytes_of(t: torch.Tensor):
    """The writable bytes of a contiguous CPU tensor, without numpy (the GPU image has none)."""
    return (ctypes.c_ubyte * t.nbytes).from_address(t.data_ptr())


def load_weights(ckpt: Checkpoint, model: KimiLinearModel, progress: bool = True):
    """Shard by shard, tensor by tensor, in file order: each tensor's bytes go straight into its
    preallocated slot (CPU) or through one buffer of that tensor alone (other devices, casts)."""
    from tqdm import tqdm
    expected = table.expand(ckpt.config)
    with tqdm(total=len(ckpt.names), desc=f"loading {ckpt.path.name}", unit="tensor",
              disable=not progress) as bar:
        for shard in ckpt.shards:
            header = ckpt.headers[shard]
            with open(shard, "rb") as f:
                for name in sorted(header.tensors, key=lambda n: header.spans[n][0]):
                    base, part = table.split_part(name)
                    _read_into(f, name, header, table.slot(model, *_path_part(expected, base, part)))
                    bar.update(1)


def load_kimi_linear(path, device="cpu", threads=None, progress=True, dtype=None, rehash=True,
                     offload: frozenset[int] = frozenset(), cache_slots: int = 0):
    """-> LoadedModel(model_id, model, tokenizer, chat, context_length, source, counters).
    rehash: re-hash an INT4 artifact's files against its manifest before loading; offload:
    MoE layers whose routed experts are read into RAM (read straight into their banks);
    cache_slots: experts of those the device caches (--moe-cache)."""
    from engined.chat.kimi_template import KimiChatFormat
    from engined.chat.kimi_tokenizer import KimiTokenizer
    if threads is not None:
        torch.set_num_threads(threads)
    ckpt = open_checkpoint(path, rehash=rehash)
    model = build_empty(ckpt, device, dtype, offload=offload, cache_slots=cache_slots)
    check_contract(ckpt, model)
    tokenizer = KimiTokenizer.from_dir(ckpt.path)
    if tokenizer.vocab_size > ckpt.config.vocab_size:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} ids but the model only "
                              f"{ckpt.config.vocab_size}")
    load_weights(ckpt, model, progress)
    model.settle_on_device_()
    chat = KimiChatFormat.from_dir(ckpt.path, tokenizer)
    return LoadedModel(ckpt.path.name, model, tokenizer, chat, ckpt.config.context_length,
                       ckpt.path, model.offload_counters)
