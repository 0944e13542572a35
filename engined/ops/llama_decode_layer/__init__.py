"""llama_decode_layer: one Llama decoder layer for B <= helper.MAX_ROWS decode rows, each on
its own sequence's KV cache (RMSNorm, q/k/v, RoPE, attention, o + residual, RMSNorm,
SwiGLU, down + residual). The CPU variant is one C call per layer."""
from engined.ops.llama_decode_layer import cpu_c, reference  # noqa: F401  (registers variants)
