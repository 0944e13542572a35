"""A stack of E packed-INT4 linears of one shape: the experts of one MoE projection.

| tensor  | shape       | dtype |
|---------|-------------|-------|
| qweight | [E, N, K/2] | uint8 |
| scales  | [E, N, K/G] | fp16  |
| mins    | [E, N, K/G] | fp16, or None: symmetric (w = s*(q - 8)) |

Expert e is exactly the PackedInt4 (qweight[e], scales[e], mins[e] or None, G).
"""
from dataclasses import dataclass

import torch

from engined.ops import int4_format
from engined.ops.int4_format import FormatError, PackedInt4


@dataclass(frozen=True, eq=False)
class PackedInt4Experts:
    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    group_size: int
    gpu_order: bool = False  # codes permuted for the GPU kernels (int4_format.gpu_order)
    tiles: bool = False  # each expert in the CPU's tiles (to_tiles): the C moe_grouped ops only

    def __post_init__(self):
        if self.qweight.dim() != 3:
            raise FormatError(f"expert qweight must be [E, N, K/2], got {list(self.qweight.shape)}")
        self.expert(0)  # every expert has the same shape: checking one checks the format

    @property
    def shape(self) -> tuple[int, int, int]:
        e, n, half_k = self.qweight.shape
        return e, n, 2 * half_k

    @property
    def num_experts(self) -> int:
        return self.qweight.shape[0]

    @property
    def symmetric(self) -> bool:
        return self.mins is None

    def expert(self, e: int) -> PackedInt4:
        mins = None if self.mins is None else self.mins[e]
        return PackedInt4(self.qweight[e], self.scales[e], mins, self.group_size, self.gpu_order,
                          self.tiles)

    def flat(self) -> PackedInt4:
        """The stack as one linear [E * N, K] (views, the same flags): tiles are whole rows,
        so its rows tiled are each expert's."""
        e, n, k = self.shape
        return PackedInt4(self.qweight.view(e * n, k // 2), self.scales.view(e * n, -1),
                          None if self.mins is None else self.mins.view(e * n, -1),
                          self.group_size, self.gpu_order, self.tiles)

    def to_tiles(self) -> "PackedInt4Experts":
        """Every expert in the CPU's tiles of 16 rows (new tensors; int4_format.to_tiles, which
        refuses a stack in tiles already or in the GPU order)."""
        tiled = int4_format.to_tiles(self.flat())
        return PackedInt4Experts(tiled.qweight.reshape(self.qweight.shape),
                                 tiled.scales.reshape(self.scales.shape),
                                 None if tiled.mins is None else tiled.mins.reshape(self.scales.shape),
                                 self.group_size, tiles=True)

    @classmethod
    def stack(cls, experts: list[PackedInt4]) -> "PackedInt4Experts":
        layouts = {p.layout for p in experts}
        if len(layouts) != 1:
            raise FormatError(f"experts mix layouts {sorted(layouts, key=str)}")
        mins = None if experts[0].symmetric else torch.stack([p.mins for p in experts])
        if any(p.tiles for p in experts):
            raise FormatError("experts in the CPU's tiles do not stack (int4_format.from_tiles)")
        if len({p.gpu_order for p in experts}) != 1:
            raise FormatError("experts mix the disk's and the GPU's code order")
        return cls(torch.stack([p.qweight for p in experts]),
                   torch.stack([p.scales for p in experts]), mins, layouts.pop().group_size,
                   experts[0].gpu_order)


def check_routes(x: torch.Tensor, experts: PackedInt4Experts, expert_ids: torch.Tensor):
    """x: [1 or R, K]; expert_ids: [R] integers in 0..E-1. Raises ValueError otherwise."""
    e, _, k = experts.shape
    if expert_ids.dim() != 1 or expert_ids.numel() == 0 or expert_ids.is_floating_point():
        raise ValueError(f"expert_ids must be a non-empty 1-D integer tensor, got "
                         f"{expert_ids.dtype} {list(expert_ids.shape)}")
    routes = expert_ids.numel()
    if x.dim() != 2 or x.shape[1] != k or x.shape[0] not in (1, routes):
        raise ValueError(f"x must be [1, {k}] or [{routes}, {k}], got {list(x.shape)}")
    lo, hi = int(expert_ids.min()), int(expert_ids.max())
    if lo < 0 or hi >= e:
        raise ValueError(f"expert ids must lie in 0..{e - 1}, got {lo}..{hi}")
