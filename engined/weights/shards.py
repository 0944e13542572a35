"""Safetensors files of a checkpoint directory: their names and a header reader that reads
only the JSON table (planning and verifying never read tensor data).

Imported by the Kimi checkpoint loader and by the manifest alike, so neither imports the
other for these."""
import json
import pathlib
import struct
from dataclasses import dataclass

import torch

MANIFEST = "kimi-int4.json"
INDEX = "model.safetensors.index.json"
ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "U8": torch.uint8,
             "I64": torch.int64, "I32": torch.int32}
MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(ValueError):
    """The directory is not a Kimi-Linear checkpoint this engine can load."""


@dataclass(frozen=True)
class Header:
    meta: dict[str, str]
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name -> (safetensors dtype, shape)
    spans: dict[str, tuple[int, int]]                 # name -> absolute [begin, end) file offsets


def read_header(path: pathlib.Path) -> Header:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path.name}: too short to be a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise CheckpointError(f"{path.name}: header length {length} is impossible")
        try:
            raw = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path.name}: header is not JSON ({exc})") from None
    meta = raw.pop("__metadata__", None) or {}
    try:
        tensors = {n: (e["dtype"], tuple(e["shape"])) for n, e in raw.items()}
        spans = {n: (8 + length + e["data_offsets"][0], 8 + length + e["data_offsets"][1])
                 for n, e in raw.items()}
    except (KeyError, TypeError, IndexError) as exc:
        raise CheckpointError(f"{path.name}: malformed tensor entry ({exc!r})") from None
    return Header(meta, tensors, spans)
