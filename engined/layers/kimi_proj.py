"""A projection whose weight is dense (bf16/fp32) or packed INT4, filled slot by slot by a loader.

Imports nothing that needs cffi, so the GPU image (no cffi) can build the model.
"""
import torch
import torch.nn.functional as F

from engined.ops import int4_format, registry

GEMV_MAX_ROWS = 8
INT4_PARTS = ("qweight", "scales", "mins")


class SlotError(ValueError):
    """A checkpoint tensor does not fit the slot it maps to."""


def fill(slot: torch.Tensor, tensor: torch.Tensor, what: str):
    """Copy one checkpoint tensor into its preallocated slot (shape must match, dtype is cast)."""
    if tuple(slot.shape) != tuple(tensor.shape):
        raise SlotError(f"{what}: checkpoint shape {tuple(tensor.shape)} != model shape "
                        f"{tuple(slot.shape)}")
    if slot.dtype == torch.uint8 and tensor.dtype != torch.uint8:
        raise SlotError(f"{what}: packed INT4 codes must be uint8, got {tensor.dtype}")
    slot.copy_(tensor)


class Proj:
    """y = x @ W^T. W: [N, K] dense, or INT4 (qweight [N, K/2] u8, scales/mins [N, K/G] fp16)."""

    def __init__(self, out_features: int, in_features: int, dtype: torch.dtype,
                 device="cpu", group_size: int | None = None):
        self.out_features, self.in_features = out_features, in_features
        self.group_size = group_size
        self.device = torch.device(device)
        if group_size is None:
            self.weight = torch.empty(out_features, in_features, dtype=dtype, device=device)
            return
        if in_features % group_size:
            raise SlotError(f"K={in_features} is not a multiple of group size {group_size}")
        groups = in_features // group_size
        self.qweight = torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device)
        self.scales = torch.empty(out_features, groups, dtype=torch.float16, device=device)
        self.mins = torch.empty(out_features, groups, dtype=torch.float16, device=device)
        self._gemv = None  # resolved at the first call (a model planned on "meta" never runs)
        self._packed = None

    @property
    def is_int4(self) -> bool:
        return self.group_size is not None

    def slot(self, part: str) -> torch.Tensor:
        allowed = INT4_PARTS if self.is_int4 else ("weight",)
        if part not in allowed:
            raise SlotError(f"this projection is {'INT4' if self.is_int4 else 'dense'}; "
                            f"it has no {part!r} tensor")
        return getattr(self, part)

    @property
    def packed(self) -> int4_format.PackedInt4:
        """One object for the life of the projection (kernels cache per-object pointers);
        the loader fills the same tensors in place, so building it late is safe."""
        if self._packed is None:
            self._packed = int4_format.PackedInt4(self.qweight, self.scales, self.mins, self.group_size)
        return self._packed

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """W: [N, K] in dtype (dequantized for INT4)."""
        if self.is_int4:
            return int4_format.dequantize(self.packed).to(dtype)
        return self.weight.to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, K] -> [T, N] in x.dtype
        if not self.is_int4:
            return F.linear(x, self.weight.to(x.dtype))  # no-op cast when dtypes agree
        if x.shape[0] <= GEMV_MAX_ROWS:
            if self._gemv is None:
                self._gemv = registry.resolve("w4a16_gemv", self.device.type).fn
            return self._gemv(x, self.packed).to(x.dtype)
        return F.linear(x, self.dense_weight(x.dtype))

    @property
    def nbytes(self) -> int:
        parts = INT4_PARTS if self.is_int4 else ("weight",)
        return sum(getattr(self, p).numel() * getattr(self, p).element_size() for p in parts)
