"""moe_swiglu: silu(x_r @ G_e^T) * (x_r @ U_e^T) for the selected experts e of one token."""
from engined.ops.moe_swiglu import cpu_c, reference  # noqa: F401  (registers the variants)
