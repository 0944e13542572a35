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
from engined.models.kimi_linear import int4_parts
from engined.ops import int4_format, registry

OP = "w4a16_tiles"


def tile_linears_(model) -> int:
    """Every INT4 linear of `model` on the CPU whose rows are whole tiles (and whose views'
    rows are too) into the CPU's tiles, in place, run by w4a16_tiles; a view (q_proj, rows
    of the stacked qkv; a shared expert's gate and up) is marked, its base moved. Linears
    are grouped by the storage of their codes, so that each storage is moved once whatever
    torch remembers of views (inference_mode forgets _base). Nothing where w4a16_tiles's CPU
    variant is not the C helper's. Returns the storages moved; the model's decode_gemv then
    names the op (the daemon's log)."""
    if registry.resolve(OP, "cpu").name != "cpu_c":
        return 0
    groups: dict[int, list[Linear]] = {}
    for lin in int4_parts(model):
        if isinstance(lin, Linear) and lin.qweight.device.type == "cpu" and not lin.packed.tiles:
            groups.setdefault(lin.qweight.untyped_storage().data_ptr(), []).append(lin)
    moved = 0
    for group in groups.values():
        whole = [lin for lin in group
                 if lin.qweight.numel() == lin.qweight.untyped_storage().nbytes()]
        if not whole or not int4_format.can_tile(whole[0].packed) or not all(
                _whole_tiles(lin, whole[0]) for lin in group):
            continue        # a storage no linear covers (an arena), or rows not whole tiles
        base = whole[0]
        base.to_tiles_(op=OP)
        for lin in group:
            if lin is not base:     # a view, or another linear around the same tensors
                lin.to_tiles_(op=OP, permute=False)
        moved += 1
    if moved:
        model.decode_gemv = OP
    return moved


def _whole_tiles(view: Linear, base: Linear) -> bool:
    """Whether a view's rows of its base are whole tiles (a first row and a count of 16s)."""
    first = (view.qweight.data_ptr() - base.qweight.data_ptr()) // base.qweight.shape[-1]
    return first % int4_format.TILE == 0 and view.qweight.shape[0] % int4_format.TILE == 0
