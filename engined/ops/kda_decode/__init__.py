"""kda_decode: a KDA layer's decode step between its projections and o_proj, for B sequences
whose conv windows and recurrent states live in slots of per-layer pools, updated in place
(short conv + SiLU, L2 norms, decay gate, delta rule, gated RMS norm: one launch on a GPU)."""
from engined.ops import registry
from engined.ops.kda_decode import cpu_c, cpu_rows, reference  # noqa: F401  (registers variants)

registry.register("kda_decode", "triton", devices=("cuda",), description=(
    "Triton: one program per (row, head), the whole head's step on its slot, in place"))(
    registry.lazy("engined.ops.kda_decode.triton:kda_decode"))
registry.set_default("kda_decode", "cuda", "triton")
