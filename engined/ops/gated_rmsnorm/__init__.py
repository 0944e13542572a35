"""gated_rmsnorm: KDA's output norm over a prefill chunk, RMS_eps(o) * weight * sigmoid(z) per
head, rounded once to the activations' dtype (the decode step has it inside kda_decode)."""
from engined.ops import registry
from engined.ops.gated_rmsnorm import reference  # noqa: F401  (registers the reference)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("gated_rmsnorm", "triton", devices=("cuda",), description=(
    "Triton: a tile of head rows a program, the norm, weight and gate in fp32, one store"))(
    registry.lazy("engined.ops.gated_rmsnorm.triton:gated_rmsnorm"))
registry.set_default("gated_rmsnorm", "cuda", "triton")
