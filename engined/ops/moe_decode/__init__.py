"""moe_decode: a decode step's whole routed-MoE FFN for B rows from the router's logits: the
top-k routing, the k chosen SwiGLU experts, the shared expert, and the weighted sum."""
from engined.ops import registry
from engined.ops.moe_decode import reference  # noqa: F401  (registers the reference and cpu)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("moe_decode", "triton", devices=("cuda",), description=(
    "Triton: two launches (gate/up of every route with the shared expert, then down with the "
    "weighted sum), routing recomputed in each; grids sized by the B*(k+1) routes"))(
    registry.lazy("engined.ops.moe_decode.triton:moe_decode"))
registry.set_default("moe_decode", "cuda", "triton")
registry.set_default("moe_decode", "cpu", "composed")
