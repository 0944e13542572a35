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


TILE = 16  # rows per tile, as the INT4 tiles (int4_format.TILE, csrc/kimi_tiles.h)


@dataclass(frozen=True)
class PackedQ8:
    """W in Q8_0: q [N, K] int8, scales [N, K/32] fp16 (w = scale * q). tiles: the same tensors
    rearranged for the CPU's tile kernel (q8_tiles; in memory only): per tile of 16 rows and
    chunk of 4 inputs, 64 bytes, 4 per row; scales [N/16, K/32, 16]."""
    q: torch.Tensor
    scales: torch.Tensor
    tiles: bool = False

    def tile_tensors(self, back: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, scales) as new tensors of the same shapes, into the tiles or back from them."""
        n, k = self.q.shape
        if n % TILE or k % BLOCK:
            raise registry.KernelError(f"q8 tiles need N % {TILE} == 0 and K % {BLOCK} == 0, "
                                       f"got {n} x {k}")
        q = self.q.reshape(*((n // TILE, k // 4, TILE, 4) if back else (n // TILE, TILE, k // 4, 4)))
        s = self.scales.reshape(*((n // TILE, k // BLOCK, TILE) if back else (n // TILE, TILE, k // BLOCK)))
        return (q.transpose(1, 2).reshape(n, k).contiguous(),
                s.transpose(1, 2).reshape(n, k // BLOCK).contiguous())

    def tile_in_place_(self, back: bool = False, block_rows: int = 4096):
        """tile_tensors written back into q and scales, block_rows rows (a multiple of 16) at
        a time: a block's tiles are that block's bytes, so the transient copy is one block."""
        n = self.q.shape[0]
        for start in range(0, n, block_rows):
            end = min(start + block_rows, n)
            block = PackedQ8(self.q[start:end], self.scales[start:end], self.tiles)
            for dst, src in zip((block.q, block.scales), block.tile_tensors(back)):
                dst.copy_(src)

    def in_tiles(self) -> "PackedQ8":
        return self if self.tiles else PackedQ8(*self.tile_tensors(), tiles=True)

    def untiled(self) -> "PackedQ8":
        return PackedQ8(*self.tile_tensors(back=True)) if self.tiles else self

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

    def dequantize(self, rows: torch.Tensor | slice = slice(None),
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Rows of W: [R, K] in `dtype`, exact in float32 too (an int8 code times an fp16
        scale needs at most 18 bits of mantissa). The embedding lookup asks for float32 rows
        by token id; the reference for float64."""
        if self.tiles:  # row i is lane i % 16 of tile i // 16
            n, k = self.q.shape
            index = rows if isinstance(rows, torch.Tensor) else torch.arange(n)[rows]
            tile, lane = index // TILE, index % TILE
            q = self.q.view(n // TILE, k // 4, TILE, 4)[tile, :, lane, :].reshape(-1, k)
            s = self.scales.view(n // TILE, k // BLOCK, TILE)[tile, :, lane]
        else:
            q, s = self.q[rows], self.scales[rows]
        n, k = q.shape
        return (q.to(dtype).view(n, k // BLOCK, BLOCK) * s.to(dtype)[..., None]).view(n, k)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * 2


@registry.register("q8_tiles", registry.REFERENCE,
                   description="back out of the tiles, then q8_gemv's reference")
def q8_tiles(x: torch.Tensor, w: PackedQ8, out: torch.Tensor | None = None) -> torch.Tensor:
    if not w.tiles:
        raise registry.KernelError("q8_tiles: W is not in tiles (PackedQ8.in_tiles)")
    return q8_gemv(x, w.untiled(), out)


@registry.register("q8_gemv", registry.REFERENCE,
                   description="quantize x per 32-block to int8, then float64 matmul")
def q8_gemv(x: torch.Tensor, w: PackedQ8, out: torch.Tensor | None = None) -> torch.Tensor:
    w.check()
    if w.tiles:
        raise registry.KernelError("q8_gemv: W is in the CPU's tiles (q8_tiles runs it)")
    xq, d = quantize_rows(x)
    y = (dequantize_rows(xq, d) @ w.dequantize().to(x.device).t()).float()  # [M, N]
    return y if out is None else out.copy_(y)
