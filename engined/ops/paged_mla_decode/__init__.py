"""paged_mla_decode: absorbed MLA attention of one decode token for each of B sequences, each
over its own latent rows, read through its block table from the layer's paged latent pool."""
from engined.ops import registry
from engined.ops.paged_mla_decode import cpu_rows, reference  # noqa: F401  (registers variants)

registry.register("paged_mla_decode", "triton", devices=("cuda",), description=(
    "Triton: per (row, head block, key range) partial online softmax, merged in a second kernel"))(
    registry.lazy("engined.ops.paged_mla_decode.triton:paged_mla_decode"))
registry.set_default("paged_mla_decode", "cuda", "triton")
