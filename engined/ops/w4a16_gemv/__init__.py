"""w4a16_gemv: y[M, N] = x[M, K] @ W[N, K]^T with W in packed INT4, M in 1..8."""
from engined.ops.w4a16_gemv import cpu_c, reference  # noqa: F401  (registers the variants)
