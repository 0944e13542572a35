"""moe_swiglu: silu(x_r @ G_e^T) * (x_r @ U_e^T) for the selected experts e of one token."""
from engined.ops import registry
from engined.ops.moe_swiglu import cpu_c, reference  # noqa: F401  (registers variants)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("moe_swiglu", "triton", devices=("cuda",), description=(
    "Triton: gate/up GEMV rows + SwiGLU epilogue in one launch"))(
    registry.lazy("engined.ops.moe_swiglu.triton:moe_swiglu"))
registry.set_default("moe_swiglu", "cuda", "triton")
