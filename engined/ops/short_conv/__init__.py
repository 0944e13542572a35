"""short_conv: KDA's causal depthwise convolutions and SiLU over a prefill chunk, q, k and v
side by side, each part's output contiguous for the chunked prefill that reads it (the decode
step has them inside kda_decode)."""
from engined.ops import registry
from engined.ops.short_conv import reference  # noqa: F401  (registers the reference)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("short_conv", "triton", devices=("cuda",), description=(
    "Triton: a [tokens, channels] tile a program, taps in fp32, the windows moved on in place"))(
    registry.lazy("engined.ops.short_conv.triton:short_conv"))
registry.set_default("short_conv", "cuda", "triton")
