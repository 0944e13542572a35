"""Plain fp32 reference for w4a16_gemv: y = x @ W^T summed in fp32, returned in x's dtype (a bf16
decode step reads and writes bf16 activations, with no cast kernels around its GEMVs).

| tensor  | shape    | dtype                                 |
|---------|----------|---------------------------------------|
| x       | [M, K]   | any float                             |
| qweight | [N, K/2] | uint8                                 |
| scales  | [N, K/G] | fp16                                  |
| mins    | [N, K/G] | fp16, or None (symmetric: w = s*(q-8)) |
| out     | [M, N]   | x's dtype                             |
"""
import torch

from engined.ops import int4_format, registry


@registry.register("w4a16_gemv", registry.REFERENCE, description="dequantize to fp32, then matmul")
def w4a16_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    y = (x.float() @ int4_format.dequantize(w).t()).to(x.dtype)  # [M, K] @ [K, N] -> [M, N]
    return y if out is None else out.copy_(y)
