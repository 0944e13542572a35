"""w4a8_gemv on CPU through the C helper: x quantized to int8 per 32-block, integer dots.

Same calling convention and weight handle as w4a16_gemv's cpu_c (one pass over W for up to
helper.MAX_ROWS rows of x); the integer-dot kernel follows helper.w4a8_simd's cap (AVX-512
VNNI, AVX-VNNI, AVX2: the same bits) and gemv_simd's, and helper.w4a8_simd() says which runs.
"""
import torch

from engined import helper
from engined.ops import int4_format, registry
from engined.ops.w4a16_gemv.cpu_c import launch
from engined.ops.w4a8_gemv.reference import check_group


@registry.register("w4a8_gemv", "cpu_c", devices=("cpu",),
                   description="C helper: int8 x per 32-block, maddubs integer dots (AVX2)")
def w4a8_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
              ) -> torch.Tensor:
    """x: [M, K] -> [M, N] fp32, written into `out` when given (contiguous fp32 [M, N])."""
    check_group(w)
    return launch("w4a8_gemv", helper.gemv_w4a8, (w,), x, out)


registry.set_default("w4a8_gemv", "cpu", "cpu_c")
