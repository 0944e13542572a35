"""llama_decode_layer on CPU: the whole layer in one C helper call (csrc/kimi_llama.c), its
four GEMVs on the helper's threads (W4A16 or W4A8 as the layer says), the rest plain loops
on the caller. The layer's C handle is built once and cached for the life of the layer."""
import weakref

import torch

from engined import helper
from engined.ops import registry
from engined.ops.llama_decode_layer.reference import LlamaLayer
from engined.ops.w4a16_gemv.cpu_c import c_weight, num_threads

_handles: "weakref.WeakKeyDictionary[LlamaLayer, helper.LlamaLayerHandle]" = weakref.WeakKeyDictionary()


def c_layer(layer: LlamaLayer) -> "helper.LlamaLayerHandle":
    """The helper's handle for `layer` (KernelError for a shape the C call refuses)."""
    found = _handles.get(layer)
    if found is None:
        try:
            found = helper.llama_layer(
                layer.attn_norm, layer.ffn_norm, layer.eps,
                *(c_weight(w) for w in (layer.qkv, layer.o, layer.gate_up, layer.down)),
                layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.gemv != "w4a16_gemv")
        except ValueError as exc:
            raise registry.KernelError(f"llama_decode_layer: {exc}") from None
        _handles[layer] = found
    return found


@registry.register("llama_decode_layer", "cpu_c", devices=("cpu",),
                   description="C helper: the whole layer in one call")
def llama_decode_layer(h: torch.Tensor, layer: LlamaLayer, cos: torch.Tensor, sin: torch.Tensor,
                       kv: list[torch.Tensor], positions: list[int],
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """h: [B, D] -> [B, D] fp32 (into `out` when given; out may be h)."""
    try:
        return helper.llama_decode_layer(c_layer(layer), h, cos, sin, kv, positions, out,
                                         num_threads())
    except ValueError as exc:
        raise registry.KernelError(f"llama_decode_layer: {exc}") from None


def llama_decode_layers(h: torch.Tensor, layers: list[LlamaLayer], cos: torch.Tensor,
                        sin: torch.Tensor, caches: list[torch.Tensor], positions: list[int],
                        final_norm=None) -> torch.Tensor:
    """Every layer of a decode step, as the call above on each, layer i on caches[b][i]
    (caches: B whole caches [L, 2, S_max, KVH, hd]); h [B, D] fp32 updated in place and
    returned, or with final_norm (an RMSNorm: weight [D] fp32, eps) its norm of h, [B, D].
    One C call (helper.llama_decode_layers): the checks and pointers made once."""
    weight, eps = (None, 0.0) if final_norm is None else (final_norm.weight, final_norm.eps)
    try:
        return helper.llama_decode_layers([c_layer(layer) for layer in layers], h, cos, sin,
                                          caches, positions, num_threads(), weight, eps)
    except ValueError as exc:
        raise registry.KernelError(f"llama_decode_layer: {exc}") from None


llama_decode_layer.all_layers = llama_decode_layers  # the step-wide form a model may call
registry.set_default("llama_decode_layer", "cpu", "cpu_c")
