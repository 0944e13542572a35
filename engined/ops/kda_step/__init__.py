"""kda_step: one recurrent KDA step for B sequences, each state read and updated in place in
its slot of a per-layer pool (the batched decode of Kimi-Linear's linear-attention layers)."""
from engined.ops import registry
from engined.ops.kda_step import cpu_batched, reference  # noqa: F401  (registers variants)

registry.register("kda_step", "triton", devices=("cuda",), description=(
    "Triton: per (row, head, V block) program on its slot's state, in place"))(
    registry.lazy("engined.ops.kda_step.triton:kda_step"))
registry.set_default("kda_step", "cuda", "triton")
