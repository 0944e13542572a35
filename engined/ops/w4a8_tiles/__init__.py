"""w4a8_tiles: y[M, N] = q8(x)[M, K] @ W[N, K]^T for any M, W packed INT4 in the CPU's tiles
(int4_format.to_tiles) and x quantized to int8 per block of 32: the Llama family's CPU
projections, decode rows, verify steps and prefill chunks alike."""
from engined.ops.w4a8_tiles import cpu_c, reference  # noqa: F401  (registers variants)
