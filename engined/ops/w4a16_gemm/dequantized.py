"""w4a16_gemm on a GPU: W dequantized once per call, then one matmul (the device's memory holds
that transient; a prefill chunk amortizes it over its rows). fp32, as the reference: the codes
may be in either order (int4_format.dequantize reads both)."""
import torch

from engined.ops import int4_format, registry


@registry.register("w4a16_gemm", "dequantized", devices=("cpu", "cuda"),
                   description="dequantize W, one fp32 matmul (a GPU's prefill rows)")
def w4a16_gemm(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    y = x.float() @ int4_format.dequantize(w).t()  # [M, K] @ [K, N] -> [M, N]
    return y if out is None else out.copy_(y)
