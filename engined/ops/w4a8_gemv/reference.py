"""Plain reference for w4a8_gemv: quantize x as the C helper does, then exact float64 dots.

| tensor  | shape      | dtype                                   |
|---------|------------|-----------------------------------------|
| x       | [M, K]     | any float (K a multiple of 32)          |
| xq      | [M, K]     | int8 in -127..127 (`quantize_rows`)     |
| d       | [M, K/32]  | fp32, one scale per block of 32         |
| qweight | [N, K/2]   | uint8                                   |
| scales  | [N, K/G]   | fp16 (G a multiple of 32)               |
| mins    | [N, K/G]   | fp16, or None (symmetric: w = s*(q-8))  |
| out     | [M, N]     | fp32                                    |

Block b of row m: d = max|x| / 127 in fp32 (0 below the smallest normal float), and
xq = x * (1/d) rounded half away from zero, every step in fp32 as csrc/kimi_w4a8.c does, so
the integers agree bit for bit. The product is float64 of the dequantized x and weight.
"""
import torch

from engined.ops import int4_format, registry

BLOCK = 32
FLT_MIN = torch.finfo(torch.float32).tiny


def quantize_rows(x: torch.Tensor, top: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (xq int8 [M, K], d fp32 [M, K/32]). top=32767: int16 codes, as
    moe_grouped's W4A16 integer dots round (csrc/kimi_moe_i16.c)."""
    m, k = x.shape
    if k % BLOCK:
        raise registry.KernelError(f"w4a8_gemv: K must be a multiple of {BLOCK}, got {k}")
    xb = x.float().reshape(m, k // BLOCK, BLOCK)               # [M, B, 32]
    d = xb.abs().amax(-1) / top                                # fp32 [M, B]
    d = torch.where(d >= FLT_MIN, d, torch.zeros_like(d))
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    v = xb * inv[..., None]                                    # fp32, as C
    t = torch.trunc(v)
    frac = v - t                                               # exact
    q = t + (frac >= 0.5).float() - (frac <= -0.5).float()     # half away from zero
    codes = torch.int8 if top == 127 else torch.int16
    return q.clamp(-top, top).to(codes).reshape(m, k), d


def dequantize_rows(xq: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(xq [M, K], d [M, K/32]) -> the x the integer dots see, float64 [M, K]."""
    m, k = xq.shape
    return (xq.double().reshape(m, -1, BLOCK) * d.double()[..., None]).reshape(m, k)


def check_group(w: int4_format.PackedInt4):
    if w.group_size % BLOCK:
        raise registry.KernelError(f"w4a8_gemv: the group size must be a multiple of {BLOCK}, "
                                   f"got {w.group_size} (use w4a16_gemv)")


@registry.register("w4a8_gemv", registry.REFERENCE,
                   description="quantize x per 32-block to int8, then float64 matmul")
def w4a8_gemv(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
              ) -> torch.Tensor:
    check_group(w)
    xq, d = quantize_rows(x)
    w64 = int4_format.dequantize(w).to(x.device).double()     # [N, K], exact
    y = (dequantize_rows(xq, d) @ w64.t()).float()             # [M, K] @ [K, N] -> [M, N]
    return y if out is None else out.copy_(y)
