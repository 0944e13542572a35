"""w4a16_gemv: y[M, N] = x[M, K] @ W[N, K]^T with W in packed INT4, M in 1..8."""
from engined.ops import registry
from engined.ops.w4a16_gemv import cpu_c, reference  # noqa: F401  (registers variants)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("w4a16_gemv", "triton", devices=("cuda",), description=(
    "Triton GEMV: single-row accumulator along contiguous K"))(
    registry.lazy("engined.ops.w4a16_gemv.triton:w4a16_gemv"))
registry.set_default("w4a16_gemv", "cuda", "triton")
