"""w4a8_gemv: y[M, N] = q8(x)[M, K] @ W[N, K]^T with W packed INT4 and x quantized to int8
per block of 32 (llama.cpp's Q8_0 activations), group size a multiple of 32."""
from engined.ops.w4a8_gemv import cpu_c, reference  # noqa: F401  (registers variants)
