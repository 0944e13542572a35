"""w4a16_grouped_gemv: the selected experts of one token, y[r] = x_r @ W[expert_ids[r]]^T."""
from engined.ops import registry
from engined.ops.w4a16_grouped_gemv import cpu_c, reference  # noqa: F401  (registers)
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts  # noqa: F401

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("w4a16_grouped_gemv", "triton", devices=("cuda",), description=(
    "Triton grouped GEMV: expert id read in-kernel, single-row accumulator"))(
    registry.lazy("engined.ops.w4a16_grouped_gemv.triton:w4a16_grouped_gemv"))
registry.set_default("w4a16_grouped_gemv", "cuda", "triton")
