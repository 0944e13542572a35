"""Plain reference for w4a16_tiles: the weight back in the disk's layout, x rounded to int16 per
block of 32 as the C helper rounds it (w4a8_gemv's quantize_rows at top = 32767), float64
dots.

The tensors are w4a8_tiles's (engined/ops/w4a8_tiles/reference.py has their table); only
x's rounding differs.
"""
import torch

from engined.ops import int4_format, registry
from engined.ops.w4a8_gemv.reference import check_group, dequantize_rows, quantize_rows


def check_tiles(w: int4_format.PackedInt4, op: str = "w4a16_tiles"):
    if not w.tiles:
        raise registry.KernelError(f"{op}: the weight is not in tiles (int4_format.to_tiles)")


@registry.register("w4a16_tiles", registry.REFERENCE,
                   description="back to the disk's layout, x rounded to int16, float64 matmul")
def w4a16_tiles(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    check_tiles(w)
    check_group(w)
    w64 = int4_format.dequantize(w).to(x.device).double()        # [N, K], exact
    y = (dequantize_rows(*quantize_rows(x, 32767)) @ w64.t()).float()
    return y if out is None else out.copy_(y)
