"""w4a16_gemm: y[M, N] = x[M, K] @ W[N, K]^T with W in packed INT4, any M (prefill rows).

On the CPU the C helper decodes W tile by tile; a GPU runs tl.dot tiles that dequantize W in
the K loop (`triton`), or can dequantize W once per call and run one matmul (`dequantized`)."""
from engined.ops import registry
from engined.ops.w4a16_gemm import cpu_c, dequantized, reference  # noqa: F401  (registers variants)

registry.register("w4a16_gemm", "triton", devices=("cuda",), description=(
    "Triton: tl.dot tiles of BLOCK_M rows, the INT4 weight dequantized in the K loop"))(
    registry.lazy("engined.ops.w4a16_gemm.triton:w4a16_gemm"))
registry.set_default("w4a16_gemm", "cpu", "cpu_c")
registry.set_default("w4a16_gemm", "cuda", "triton")
