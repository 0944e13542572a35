"""Kimi-Linear's KDA decode step in C (csrc/kimi_kda.c): `kda_weights` makes a layer's
handle once (fp32 copies, f_b and g_b transposed), `kda_decode_rows` runs a step's rows on
the state pools in place."""
from __future__ import annotations

from engined.helper.core import F32, _as_rows, _out, check, ffi, lib, require, torch


class KdaWeights:
    """A layer's C struct (KhKda) without its pools; holds the fp32 tensors it points into."""

    __slots__ = ("struct", "heads", "head_dim", "taps", "_keep")

    def __init__(self, struct, heads: int, head_dim: int, taps: int, keep: tuple):
        self.struct, self.heads, self.head_dim, self.taps, self._keep = struct, heads, head_dim, taps, keep


def kda_weights(f_b, g_b, conv_w, A_log, dt_bias, o_norm_w, eps: float, scale: float) -> KdaWeights:
    """f_b, g_b [W, K]; conv_w [3, W, C]; A_log [H]; dt_bias [W]; o_norm_w [K] (any float
    dtype) -> the handle kda_decode_rows takes. ValueError for shapes the C call refuses."""
    require()
    heads, head_dim = int(A_log.numel()), int(o_norm_w.numel())
    width, taps = heads * head_dim, int(conv_w.shape[-1])
    if f_b.shape != (width, head_dim) or g_b.shape != (width, head_dim) \
            or conv_w.shape != (3, width, taps) or dt_bias.numel() != width:
        raise ValueError(f"kda_weights: f_b, g_b [{width}, {head_dim}], conv_w [3, {width}, C] "
                         f"and dt_bias [{width}] needed, got {list(f_b.shape)} {list(g_b.shape)} "
                         f"{list(conv_w.shape)} {list(dt_bias.shape)}")
    if head_dim > 256 or not 1 <= taps <= 8:
        raise ValueError(f"kda_weights: head_dim <= 256 and 1..8 taps, got {head_dim} and {taps}")
    as_f32 = lambda t: t.detach().to("cpu", F32).contiguous()  # noqa: E731
    keep = (as_f32(f_b.t()), as_f32(g_b.t()), as_f32(conv_w), as_f32(A_log.reshape(-1)),
            as_f32(dt_bias.reshape(-1)), as_f32(o_norm_w))
    a = ffi.new("KhKda *")
    a.heads, a.head_dim, a.taps = heads, head_dim, taps
    a.f_bt, a.g_bt, a.conv_w, a.A_log, a.dt_bias, a.o_norm_w = (
        ffi.cast("float *", t.data_ptr()) for t in keep)
    a.eps, a.scale = float(eps), float(scale)
    return KdaWeights(a, heads, head_dim, taps, keep)


def kda_decode_rows(weights: KdaWeights, qkv, low, conv, S, slots, out=None, threads: int = 1,
                    source=None):
    """qkv [B, 3W], low [B, 2K + H] fp32 rows on distinct slots [B] of the pools conv
    [N, 3, W, C-1] and S [N, H, K, K] (contiguous CPU fp32, updated in place) -> out [B, W].
    source [B]: the slots each row's state is read from (None: its own)."""
    h, d, taps = weights.heads, weights.head_dim, weights.taps
    width = h * d
    qkv, low = _as_rows(qkv, 3 * width), _as_rows(low, 2 * d + h)
    rows = qkv.shape[0]
    n = conv.shape[0] if conv.dim() == 4 else -1
    for name, t, shape in (("conv", conv, (n, 3, width, taps - 1)), ("S", S, (n, h, d, d))):
        if t.shape != shape or t.dtype is not F32 or not t.is_contiguous() or not t.is_cpu:
            raise ValueError(f"kda_decode_rows: {name} must be a contiguous CPU fp32 {list(shape)}, "
                             f"got {t.dtype} {list(t.shape)}")
    if low.shape[0] != rows or slots.shape != (rows,):
        raise ValueError(f"kda_decode_rows: {rows} rows of qkv, low and slots needed, got "
                         f"{low.shape[0]} and {list(slots.shape)}")
    slots = slots.to("cpu", torch.int64).contiguous()
    if source is not None:
        if source.shape != (rows,):
            raise ValueError(f"kda_decode_rows: source must be [{rows}], got {list(source.shape)}")
        source = source.to("cpu", torch.int64).contiguous()
    out = _out(out, (rows, width))
    a = weights.struct
    a.conv, a.S, a.num_slots = ffi.cast("float *", conv.data_ptr()), ffi.cast("float *", S.data_ptr()), n
    cast = ffi.cast
    status = lib.kda_decode_rows(a, cast("float *", qkv.data_ptr()), cast("float *", low.data_ptr()),
                                 rows, cast("int64_t *", slots.data_ptr()),
                                 ffi.NULL if source is None else cast("int64_t *", source.data_ptr()),
                                 cast("float *", out.data_ptr()), threads)
    if status:
        check(status, "kda_decode_rows (bad shape, two rows on one slot, or a row's source "
                      "another row's slot)")
    return out
