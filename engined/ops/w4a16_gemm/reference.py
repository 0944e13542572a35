"""Plain fp32 reference for w4a16_gemm (the same product as w4a16_gemv, for any M).

| tensor  | shape    | dtype                                  |
|---------|----------|----------------------------------------|
| x       | [M, K]   | any float, M >= 1                      |
| qweight | [N, K/2] | uint8                                  |
| scales  | [N, K/G] | fp16                                   |
| mins    | [N, K/G] | fp16, or None (symmetric: w = s*(q-8)) |
| out     | [M, N]   | fp32, or x's 16-bit dtype (given as out: the fp32 result rounded once) |
"""
import torch

from engined.ops import int4_format, registry


@registry.register("w4a16_gemm", registry.REFERENCE, description="dequantize to fp32, then matmul")
def w4a16_gemm(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    y = x.float() @ int4_format.dequantize(w).t()  # [M, K] @ [K, N] -> [M, N]
    return y if out is None else out.copy_(y)
