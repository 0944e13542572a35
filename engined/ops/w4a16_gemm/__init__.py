"""w4a16_gemm: y[M, N] = x[M, K] @ W[N, K]^T with W in packed INT4, any M (prefill rows).

On the CPU the C helper decodes W tile by tile; a GPU dequantizes W once per call and runs one
matmul (`dequantized`), since its memory holds that copy."""
from engined.ops import registry
from engined.ops.w4a16_gemm import cpu_c, dequantized, reference  # noqa: F401  (registers variants)

registry.set_default("w4a16_gemm", "cpu", "cpu_c")
registry.set_default("w4a16_gemm", "cuda", "dequantized")
