"""Compute ops behind one registry: `registry.resolve(op, device).fn(...)`."""
from engined.ops import kda_step, moe_grouped, moe_swiglu, w4a16_gemv, w4a16_grouped_gemv  # noqa: F401,E501  (registers every variant)
