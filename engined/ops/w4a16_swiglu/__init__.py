"""w4a16_swiglu: h[M, F] = silu(x gate^T) * (x up^T) with gate and up stacked in one packed-INT4
weight [2F, K] (a SwiGLU's first half: the dense FFN and the shared expert), one pass."""
from engined.ops import registry
from engined.ops.w4a16_swiglu import reference  # noqa: F401  (registers the reference and cpu)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("w4a16_swiglu", "triton", devices=("cuda",), description=(
    "Triton: w4a16_gemv's kernel, gate and up rows in one program, silu(g) * u before the store"))(
    registry.lazy("engined.ops.w4a16_gemv.triton:w4a16_swiglu"))
registry.set_default("w4a16_swiglu", "cuda", "triton")
registry.set_default("w4a16_swiglu", "cpu", "composed")
