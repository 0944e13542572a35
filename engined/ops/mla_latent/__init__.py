"""mla_latent: the new latent row [kv_a_layernorm(c) ; kr] of each of B decode tokens, written
into its layer's paged latent pool at the token's position (MLA.decode_batch's first step)."""
from engined.ops import registry
from engined.ops.mla_latent import reference  # noqa: F401  (registers the reference)

registry.register("mla_latent", "triton", devices=("cuda",), description=(
    "Triton: per row program, norm, block-table lookup and both stores in one launch"))(
    registry.lazy("engined.ops.mla_latent.triton:mla_latent"))
registry.set_default("mla_latent", "cuda", "triton")
