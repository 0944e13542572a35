"""moe_route: the router's picks for a prefill chunk's rows, each row's top-k experts by biased
sigmoid score and their unbiased, renormalized, scaled weights (moe_decode routes inside its
own kernels)."""
from engined.ops import registry
from engined.ops.moe_route import reference  # noqa: F401  (registers the reference)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("moe_route", "triton", devices=("cuda",), description=(
    "Triton: a program per row, k passes of argmax over the E scores, no host sync"))(
    registry.lazy("engined.ops.moe_route.triton:moe_route"))
registry.set_default("moe_route", "cuda", "triton")
