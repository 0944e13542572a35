"""Compute ops behind one registry: `registry.resolve(op, device).fn(...)`."""
from engined.ops import w4a16_gemv  # noqa: F401  (registers every variant of each op)
