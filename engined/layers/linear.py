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

    @classmethod
    def stacked(cls, parts: list["Int4Linear"], device: str = "cpu") -> "Int4Linear":
        """One linear whose output rows are the parts' rows in order (same K and group; rows
        keep their own scales and mins, so each output equals the part's, bit for bit, in
        one GEMV call instead of len(parts))."""
        ps = [lin.packed for lin in parts]
        if len({(p.shape[1], p.group_size) for p in ps}) != 1:
            raise ValueError("stacked linears need the same in_features and group size")
        return cls(int4_format.PackedInt4(torch.cat([p.qweight for p in ps]),
                                          torch.cat([p.scales for p in ps]),
                                          torch.cat([p.mins for p in ps]), ps[0].group_size), device)

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
