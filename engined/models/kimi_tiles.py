"""The Kimi-Linear model's INT4 linears in the CPU's tiles (the loader, once loaded, when the
model runs on the CPU): attention's q/k/v/o and MLA projections, the shared experts and the
dense layer's MLP, run by w4a16_tiles for every row count (csrc/kimi_tiles_i16.c: x rounded
to int16 per block of 32 as the routed experts' W4A16 rounds it, exact integer dots, the
same bits alone or batched).

Why: the row layout's W4A16 GEMV spends 7 vector instructions on every 32 weights and is
bound by them at more than one row, and prefill ran w4a16_gemm's fp32 tiles. On 2 Zen 5
cores (6 weights of each shape in turn, so mostly from memory): KDA's stacked q/k/v, 12288 x
2304, one row 400 -> 290 us, 8 rows (a verify step) 3.2 -> 0.83 ms, 256 rows 63 -> 25 ms;
o_proj, 2304 x 4096, 121 -> 72 us, 1.08 -> 0.31 ms, 20 -> 8.5 ms."""
from engined.layers.linear import Linear
from engined.ops import int4_format, registry

OP = "w4a16_tiles"


def tile_linears_(model) -> int:
    """Every INT4 linear of `model` on the CPU whose rows are whole tiles (and whose views'
    rows are too) into the CPU's tiles, in place, run by w4a16_tiles; a view (q_proj, rows
    of the stacked qkv; a shared expert's gate and up) is marked, its base moved. Nothing
    where w4a16_tiles's CPU variant is not the C helper's. Returns the linears moved."""
    from engined.models.kimi_linear import int4_parts
    if registry.resolve(OP, "cpu").name != "cpu_c":
        return 0
    linears = [p for p in int4_parts(model)
               if isinstance(p, Linear) and p.qweight.device.type == "cpu" and not p.packed.tiles]
    bases = {id(lin.qweight): lin for lin in linears if lin.qweight._base is None}
    views = [lin for lin in linears if lin.qweight._base is not None]
    refused = {id(v.qweight._base) for v in views if not _whole_tiles(v)}
    moved = [lin for key, lin in bases.items()
             if key not in refused and int4_format.can_tile(lin.packed)]
    for lin in moved:
        lin.to_tiles_(op=OP)
    tiled = {id(lin.qweight) for lin in moved}
    for view in views:
        if id(view.qweight._base) in tiled:
            view.to_tiles_(op=OP, permute=False)
    return len(moved)


def _whole_tiles(view: Linear) -> bool:
    """Whether a view's rows of its base are whole tiles (a first row and a count of 16s)."""
    base = view.qweight._base
    first = (view.qweight.data_ptr() - base.data_ptr()) // base.shape[-1]
    return first % int4_format.TILE == 0 and view.qweight.shape[0] % int4_format.TILE == 0
