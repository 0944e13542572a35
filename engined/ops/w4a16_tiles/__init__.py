"""w4a16_tiles: y[M, N] = i16(x)[M, K] @ W[N, K]^T for any M, W packed INT4 in the CPU's tiles
(int4_format.to_tiles) and x rounded to int16 per block of 32 (moe_grouped's W4A16 rounding):
the Kimi-Linear model's INT4 linears on the CPU, decode rows and prefill chunks alike."""
from engined.ops.w4a16_tiles import cpu_c, reference  # noqa: F401  (registers variants)
