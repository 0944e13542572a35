"""Read a packed-INT4 safetensors artifact with plain file reads (format: engined/ops/README.md).

The header is parsed by hand so planning reads only the header, and each tensor is read
straight into its own torch buffer: no mmap pages and no second copy stay resident.
"""
import json
import pathlib
import struct
from dataclasses import dataclass

import torch

from engined.ops import int4_format

DTYPES = {"U8": torch.uint8, "I8": torch.int8, "F16": torch.float16, "BF16": torch.bfloat16,
          "F32": torch.float32, "I32": torch.int32, "I64": torch.int64}
MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute file offset
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    path: pathlib.Path
    meta: dict[str, str]
    tensors: dict[str, TensorInfo]


def read_header(path: pathlib.Path) -> Header:
    """Parse and validate the header; refuses unknown formats, truncation and bad offsets."""
    path = pathlib.Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise int4_format.FormatError(f"{path}: too short to be a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise int4_format.FormatError(f"{path}: header length {length} is impossible")
        try:
            raw = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise int4_format.FormatError(f"{path}: header is not JSON ({exc})") from None
    meta = raw.pop("__metadata__", None) or {}
    int4_format.check_metadata(meta, str(path))
    tensors = {name: _tensor_info(path, name, entry, 8 + length, size) for name, entry in raw.items()}
    return Header(path, meta, tensors)


def _tensor_info(path, name: str, entry: dict, base: int, size: int) -> TensorInfo:
    try:
        dtype = DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (base + int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise int4_format.FormatError(f"{path}: tensor {name!r} has a malformed entry") from None
    numel = 1
    for d in shape:
        numel *= d
    if end > size or end - begin != numel * dtype.itemsize:
        raise int4_format.FormatError(f"{path}: tensor {name!r} lies outside the file "
                                      "or does not match its shape (truncated?)")
    return TensorInfo(dtype, shape, begin, end)


class TensorReader:
    """Reads tensors one at a time into fresh buffers. Use as a context manager."""

    def __init__(self, header: Header):
        self.header = header
        self._file = open(header.path, "rb")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()

    def __contains__(self, name: str) -> bool:
        return name in self.header.tensors

    def get(self, name: str) -> torch.Tensor:
        info = self.header.tensors.get(name)
        if info is None:
            raise int4_format.FormatError(f"{self.header.path}: tensor {name!r} is missing")
        out = torch.empty(info.shape, dtype=info.dtype)
        self._file.seek(info.begin)
        view = memoryview(out.view(-1).view(torch.uint8).numpy()) if out.numel() else b""
        if out.numel() and self._file.readinto(view) != info.nbytes:
            raise int4_format.FormatError(f"{self.header.path}: short read of {name!r}")
        return out

    def packed(self, name: str) -> int4_format.PackedInt4:
        """Linear `name` by its recorded layout (a symmetric one has no mins)."""
        parts = {name + s: self.get(name + s) for s in int4_format.SUFFIXES if name + s in self}
        return int4_format.from_state_dict(name, parts, self.header.meta)
