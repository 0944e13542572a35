"""kda_decode on the CPU through the C helper (csrc/kimi_kda.c): one task per (row, head),
so a row's result is the same in any batch (ops/rowwise.py says why that matters) and a
step's rows share the pool's threads. A layer's weights are copied to fp32 once (f_b and
g_b transposed: helper.kda_weights), kept while the layer's f_b lives. Activations or pools
that are not fp32, and a process without the compiled helper, run cpu_rows."""
import weakref

import torch

from engined import helper
from engined.ops import registry
from engined.ops.kda_decode import cpu_rows, reference
from engined.ops.w4a16_gemv.cpu_c import num_threads

_WEIGHTS: dict[int, tuple] = {}  # id(f_b) -> (its weakref, what was copied, the handle)


def _handle(f_b, g_b, conv_w, A_log, dt_bias, o_norm_w, eps, scale) -> helper.KdaWeights:
    """The layer's handle, made at its first step (f_b is the layer's own tensor: it keys the
    cache; the weights' addresses and versions, so a weight written in place since, and the
    constants must match what was copied)."""
    parts = (f_b, g_b, conv_w, A_log, dt_bias, o_norm_w)
    key = tuple((t.data_ptr(), _version(t)) for t in parts) + (float(eps), float(scale))
    cached = _WEIGHTS.get(id(f_b))
    if cached is None or cached[0]() is not f_b or cached[1] != key:
        handle = helper.kda_weights(f_b, g_b, conv_w, A_log, dt_bias, o_norm_w, eps, scale)
        cached = _WEIGHTS[id(f_b)] = (weakref.ref(f_b), key, handle)
        weakref.finalize(f_b, _WEIGHTS.pop, id(f_b), None)
    return cached[2]


def _version(t: torch.Tensor) -> int:
    """t's in-place write counter (-1 for an inference tensor, which has none)."""
    return -1 if t.is_inference() else t._version


@registry.register("kda_decode", "cpu_c", devices=("cpu",),
                   description="C helper: a task per (row, head), row-exact in any batch")
def kda_decode(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w,
               eps: float, scale: float, out=None, source=None) -> torch.Tensor:
    reference.check_inputs(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w)
    if qkv.dtype != torch.float32 or conv.dtype != torch.float32 or not helper.available():
        return cpu_rows.kda_decode(qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias,
                                   o_norm_w, eps, scale, out, source)
    weights = _handle(f_b, g_b, conv_w, A_log, dt_bias, o_norm_w, eps, scale)
    y = helper.kda_decode_rows(weights, qkv, low, conv, S, slots, threads=num_threads(),
                               source=source)   # read there, written to slots: no copy first
    return y if out is None else out.copy_(y)


registry.set_default("kda_decode", "cpu", "cpu_c")
