"""Compute ops behind one registry: `registry.resolve(op, device).fn(...)`."""
from engined.ops import (  # noqa: F401  (registers every variant)
    add_rmsnorm, gated_rmsnorm, kda_decode, kda_prefill, kda_step, llama_decode_layer, mla_latent,
    moe_decode, moe_grouped, moe_grouped_w4a8, moe_route, moe_swiglu, paged_mla_decode, q8_gemv,
    short_conv, w4a16_gemm, w4a16_gemv, w4a16_grouped_gemv, w4a16_swiglu, w4a16_tiles, w4a8_gemv,
    w4a8_tiles)
