"""Plain fp32 reference for w4a16_gemv.

| tensor  | shape    | dtype         |
|---------|----------|---------------|
| x       | [M, K]   | any float     |
| qweight | [N, K/2] | uint8         |
| scales  | [N, K/G] | fp16          |
| mins    | [N, K/G] | fp16          |
| out     | [M, N]   | fp32          |
"""
import torch

from engined.ops import int4_format, registry


@registry.register("w4a16_gemv", registry.REFERENCE, description="dequantize to fp32, then matmul")
def w4a16_gemv(x: torch.Tensor, w: int4_format.PackedInt4) -> torch.Tensor:
    return x.float() @ int4_format.dequantize(w).t()
