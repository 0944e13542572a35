"""w4a16_grouped_gemv: the selected experts of one token, y[r] = x_r @ W[expert_ids[r]]^T."""
from engined.ops.w4a16_grouped_gemv import cpu_c, reference  # noqa: F401  (registers variants)
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts  # noqa: F401
