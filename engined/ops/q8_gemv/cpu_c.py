"""q8_gemv on CPU through the C helper: x quantized to int8 per 32-block, integer dots
against the Q8_0 codes (sign + maddubs on AVX2), rows split over the helper's threads."""
import torch

from engined import helper
from engined.ops import registry
from engined.ops.q8_gemv.reference import PackedQ8
from engined.ops.w4a16_gemv.cpu_c import num_threads


@registry.register("q8_gemv", "cpu_c", devices=("cpu",),
                   description="C helper: int8 x per 32-block, int8 x int8 dots (AVX2)")
def q8_gemv(x: torch.Tensor, w: PackedQ8, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K] -> [M, N] fp32, written into `out` when given (contiguous fp32 [M, N])."""
    w.check()
    try:
        return helper.gemv_q8(w.q, w.scales, x, out, num_threads())
    except ValueError as exc:
        raise registry.KernelError(f"q8_gemv: {exc}") from None


registry.set_default("q8_gemv", "cpu", "cpu_c")
