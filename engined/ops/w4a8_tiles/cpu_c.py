"""w4a8_tiles on CPU through the C helper (csrc/kimi_tiles.c): 16 output rows per vector,
one broadcast of x per 4 inputs, any row count in one pass over W; AVX-512 VNNI, AVX2 or
portable C (helper.w4a8_simd caps it), the same bits from each."""
import torch

from engined import helper
from engined.ops import int4_format, registry
from engined.ops.w4a16_gemv.cpu_c import launch
from engined.ops.w4a16_tiles.reference import check_tiles


@registry.register("w4a8_tiles", "cpu_c", devices=("cpu",),
                   description="C helper: tiles of 16 rows, vpdpbusd on broadcast x, any M")
def w4a8_tiles(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """x: [M, K] -> [M, N] fp32, written into `out` when given (contiguous fp32 [M, N])."""
    check_tiles(w, "w4a8_tiles")
    return launch("w4a8_tiles", helper.tiles_w4a8, (w,), x, out)


registry.set_default("w4a8_tiles", "cpu", "cpu_c")
