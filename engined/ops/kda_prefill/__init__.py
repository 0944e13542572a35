"""kda_prefill: a KDA layer's prefill between its short convolutions and its output norm, from
the sequence's state (a fresh one or a prefix cache's), the final state handed back into it."""
from engined.ops import registry
from engined.ops.kda_prefill import reference  # noqa: F401  (registers the reference)

registry.register("kda_prefill", "fla", devices=("cuda",), description=(
    "fla-core's Triton chunk_kda: L2 norms, gate and sigmoid fused in, state in and out"))(
    registry.lazy("engined.ops.kda_prefill.fla:kda_prefill"))
registry.set_default("kda_prefill", "cuda", "fla")
