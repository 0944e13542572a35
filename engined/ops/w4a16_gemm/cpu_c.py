"""w4a16_gemm on CPU through the C helper (csrc/kimi_gemm.c): each thread decodes tiles of 16
weight rows x 256 inputs to fp32 in L1 and multiplies them with up to 256 rows of x at a time,
so a prefill chunk never holds W in fp32 (the old path dequantized all of it per call: 38 MB
for a Kimi KDA projection, 1.5 GB for a 163840 x 2304 head quantized under plan "all"), and
runs 1.3-1.9x faster than that did (bench/prefill_gemm.py). It shares w4a16_gemv's weight
handles and thread setting."""
import torch

from engined import helper
from engined.ops import int4_format, registry
from engined.ops.w4a16_gemv.cpu_c import launch


@registry.register("w4a16_gemm", "cpu_c", devices=("cpu",),
                   description="C helper: W decoded per L1 tile, 6x16 register blocks, any M")
def w4a16_gemm(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """x: [M, K] -> [M, N] fp32, written into `out` when given (contiguous [M, N]; the helper
    writes fp32, so a 16-bit `out` gets its result rounded)."""
    wide = out is None or out.dtype == torch.float32
    y = launch("w4a16_gemm", helper.gemm, (w,), x, out if wide else None)
    return y if wide else out.copy_(y)
