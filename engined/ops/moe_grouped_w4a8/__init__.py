"""moe_grouped_w4a8: moe_grouped (the routed SwiGLU experts of T tokens, each chosen expert
read once for all its rows) with W4A8 projections: each route's x row and each row of h are
rounded to int8 per block of 32 as w4a8_gemv rounds them, and the dots are integer ones.
The grouped form of w4a8_gemv, for MoE decode on the CPU; Kimi-Linear serves moe_grouped
(W4A16) unless asked (--moe-w4a8, MoE.select_experts): its quality gate
(tests/weights/test_kimi_w4a8_experts.py) runs on a test checkpoint, not yet on real weights."""
from engined.ops.moe_grouped_w4a8 import cpu_c, reference  # noqa: F401  (registers variants)
