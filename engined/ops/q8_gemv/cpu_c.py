"""q8_gemv on CPU through the C helper: x quantized to int8 per 32-block, integer dots
against the Q8_0 codes (sign + maddubs on AVX2), rows split over the helper's threads; and
q8_tiles, the same head in tiles of 16 rows (csrc/kimi_q8_tiles.c)."""
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
    if w.tiles:
        raise registry.KernelError("q8_gemv: W is in the CPU's tiles (q8_tiles runs it)")
    try:
        return helper.gemv_q8(w.q, w.scales, x, out, num_threads())
    except ValueError as exc:
        raise registry.KernelError(f"q8_gemv: {exc}") from None


@registry.register("q8_tiles", "cpu_c", devices=("cpu",),
                   description="C helper: the Q8_0 head in tiles of 16 rows, any M")
def q8_tiles(x: torch.Tensor, w: PackedQ8, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K] -> [M, N] fp32 for W in tiles (PackedQ8.in_tiles)."""
    if not w.tiles:
        raise registry.KernelError("q8_tiles: W is not in tiles (PackedQ8.in_tiles)")
    try:
        return helper.tiles_q8(w.q, w.scales, x, out, num_threads())
    except ValueError as exc:
        raise registry.KernelError(f"q8_tiles: {exc}") from None


registry.set_default("q8_gemv", "cpu", "cpu_c")
registry.set_default("q8_tiles", "cpu", "cpu_c")
