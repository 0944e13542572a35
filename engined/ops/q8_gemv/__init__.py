"""q8_gemv: y[M, N] = q8(x)[M, K] @ W[N, K]^T with W in GGUF's Q8_0 (int8, an fp16 scale per
block of 32) and x quantized to int8 per block of 32 as w4a8_gemv does: the tied LM head at
the precision the GGUF ships, half an fp16 head's bytes. q8_tiles is the same product on W in
the CPU's tiles of 16 rows (PackedQ8.tiles), for any M."""
from engined.ops.q8_gemv import cpu_c, reference  # noqa: F401  (registers variants)
