import torch

from engined import helper
from engined.ops import int4_format, registry
from engined.ops import w4a16_gemv  # noqa: F401  (registers the op's variants)

GEMV_MAX_ROWS = 8


class Int4Linear:
    """y = x @ W^T with W in packed INT4. Decode (M <= 8) runs the registered w4a16_gemv
    variant; prefill dequantizes W once per call and runs one fp32 matmul."""

    def __init__(self, packed: int4_format.PackedInt4, device: str = "cpu"):
        self.packed = packed
        self.out_features, self.in_features = packed.shape
        self.gemv = registry.resolve("w4a16_gemv", device).fn

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, K] -> [M, N] fp32
        if x.shape[0] <= GEMV_MAX_ROWS:
            return self.gemv(x, self.packed)
        return x.float() @ self.dequantized().t()

    def dequantized(self) -> torch.Tensor:
        """W: [N, K] fp32 (the C helper on CPU, the torch reference elsewhere)."""
        p = self.packed
        if p.qweight.device.type == "cpu" and helper.lib is not None:
            w = helper.unpack_int4(p.qweight.numpy(), p.scales.numpy(), p.mins.numpy(), p.group_size)
            return torch.from_numpy(w)
        return int4_format.dequantize(p)

    @property
    def nbytes(self) -> int:
        p = self.packed
        return sum(t.numel() * t.element_size() for t in (p.qweight, p.scales, p.mins))
