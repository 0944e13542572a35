"""Plain reference for q8_gemv: quantize x as the C helper does, then exact float64 dots.

| tensor  | shape      | dtype                                        |
|---------|------------|----------------------------------------------|
| x       | [M, K]     | any float (K a multiple of 32)               |
| q       | [N, K]     | int8 (GGUF Q8_0 codes)                       |
| scales  | [N, K/32]  | fp16, one per block of 32: w = scale * q     |
| out     | [M, N]     | fp32                                         |

x is quantized by w4a8_gemv's quantize_rows (the same integers as csrc/kimi_w4a8.c); the
product is float64 of the dequantized x and weight.
"""
from dataclasses import dataclass

import torch

from engined.ops import registry
from engined.ops.w4a8_gemv.reference import BLOCK, dequantize_rows, quantize_rows


@dataclass(frozen=True)
class PackedQ8:
    """W in Q8_0: q [N, K] int8, scales [N, K/32] fp16 (w = scale * q)."""
    q: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def check(self):
        n, k = self.q.shape
        if k % BLOCK or self.q.dtype != torch.int8 or self.scales.dtype != torch.float16 \
                or tuple(self.scales.shape) != (n, k // BLOCK):
            raise registry.KernelError(
                f"q8_gemv: W must be int8 [N, K] (K a multiple of {BLOCK}) with fp16 scales "
                f"[N, K/{BLOCK}], got {self.q.dtype} {list(self.q.shape)} and "
                f"{self.scales.dtype} {list(self.scales.shape)}")

    def dequantize(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """Rows of W as float64: [R, K] (the embedding lookup and the reference)."""
        q, s = self.q[rows], self.scales[rows]
        n, k = q.shape
        return (q.double().view(n, k // BLOCK, BLOCK) * s.double()[..., None]).view(n, k)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * 2


@registry.register("q8_gemv", registry.REFERENCE,
                   description="quantize x per 32-block to int8, then float64 matmul")
def q8_gemv(x: torch.Tensor, w: PackedQ8, out: torch.Tensor | None = None) -> torch.Tensor:
    w.check()
    xq, d = quantize_rows(x)
    y = (dequantize_rows(xq, d) @ w.dequantize().to(x.device).t()).float()  # [M, N]
    return y if out is None else out.copy_(y)
