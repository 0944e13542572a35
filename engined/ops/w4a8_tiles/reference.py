"""Plain reference for w4a8_tiles: the weight back in the disk's layout, then w4a8_gemv's
reference (x quantized as the C helper does, float64 dots).

| tensor  | shape      | dtype                                                 |
|---------|------------|-------------------------------------------------------|
| x       | [M, K]     | any float, M >= 1 (K a multiple of 32)                |
| qweight | [N, K/2]   | uint8 in tiles: N % 16 == 0 (int4_format.tile_tensors) |
| scales  | [N, K/G]   | fp16 in tiles (G a multiple of 32)                    |
| mins    | [N, K/G]   | fp16 in tiles, or None (symmetric: w = s*(q-8))       |
| out     | [M, N]     | fp32                                                  |
"""
import torch

from engined.ops import int4_format, registry
from engined.ops.w4a16_tiles.reference import check_tiles
from engined.ops.w4a8_gemv.reference import w4a8_gemv




@registry.register("w4a8_tiles", registry.REFERENCE,
                   description="back to the disk's layout, then w4a8_gemv's reference")
def w4a8_tiles(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    check_tiles(w, "w4a8_tiles")
    return w4a8_gemv(x, int4_format.from_tiles(w), out)
