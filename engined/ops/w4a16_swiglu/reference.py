"""Plain fp32 reference for w4a16_swiglu, and the CPU's composed variant.

| tensor | shape     | dtype                                   |
|--------|-----------|-----------------------------------------|
| x      | [M, K]    | any float                               |
| w      | [2F, K]   | packed INT4: gate rows, then up rows    |
| out    | [M, F]    | x's dtype: silu(x gate^T) * (x up^T)    |
"""
import torch
import torch.nn.functional as F

from engined.ops import int4_format, registry


def check_inputs(x: torch.Tensor, w: int4_format.PackedInt4):
    n, k = w.shape
    if n % 2 or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"w4a16_swiglu: x [M, {k}] and a stacked [2F, {k}] weight needed, got "
                         f"{list(x.shape)} and {[n, k]}")


@registry.register("w4a16_swiglu", registry.REFERENCE,
                   description="dequantize to fp32, matmul, silu(gate) * up")
def w4a16_swiglu(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    check_inputs(x, w)
    gate, up = (x.float() @ int4_format.dequantize(w).t()).chunk(2, dim=-1)  # [M, F] each
    y = (F.silu(gate) * up).to(x.dtype)
    return y if out is None else out.copy_(y)


@registry.register("w4a16_swiglu", "composed", devices=("cpu",),
                   description="the CPU's w4a16_gemv of the stacked weight, then silu(gate) * up")
def composed(x: torch.Tensor, w: int4_format.PackedInt4, out: torch.Tensor | None = None
             ) -> torch.Tensor:
    check_inputs(x, w)
    gate_up = registry.resolve("w4a16_gemv", "cpu").fn(x, w, out=x.new_empty(
        (x.shape[0], w.shape[0]), dtype=torch.float32))         # [M, 2F], fp32 whatever x is
    f = gate_up.shape[1] // 2
    y = F.silu(gate_up[:, :f]).mul_(gate_up[:, f:]).to(x.dtype)
    return y if out is None else out.copy_(y)
