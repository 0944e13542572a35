"""w4a16_gemm: y[M, N] = x[M, K] @ W[N, K]^T with W in packed INT4, any M (prefill rows).

CPU only: a GPU prefill dequantizes W once per call and runs one matmul (layers/linear.py),
since the GPU's memory holds that copy; on the CPU the C helper decodes W tile by tile."""
from engined.ops import registry
from engined.ops.w4a16_gemm import cpu_c, reference  # noqa: F401  (registers variants)

registry.set_default("w4a16_gemm", "cpu", "cpu_c")
