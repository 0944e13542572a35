"""add_rmsnorm: the residual add and the RMS norm after it in one pass (the decode step's
`h += delta; a = norm(h)` before every attention, FFN and the LM head)."""
from engined.ops import registry
from engined.ops.add_rmsnorm import reference  # noqa: F401  (registers the reference)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("add_rmsnorm", "triton", devices=("cuda",), description=(
    "Triton: one program per row, the sum rounded to h's dtype, then the norm"))(
    registry.lazy("engined.ops.add_rmsnorm.triton:add_rmsnorm"))
registry.set_default("add_rmsnorm", "cuda", "triton")
