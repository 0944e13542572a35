"""moe_grouped: the routed SwiGLU experts of T tokens (decode rows of a batch, or a prefill
chunk), with the routes sorted by expert so each chosen expert is read once for all the rows
that chose it. Every MoE path shares it: batched decode, prefill, CPU decode, expert offload."""
from engined.ops import registry
from engined.ops.moe_grouped import cpu_c, reference  # noqa: F401  (registers variants)

# Registered lazily: triton is imported on the first call (see registry.lazy).
registry.register("moe_grouped", "triton", devices=("cuda",), description=(
    "Triton: per (expert, BLOCK_N outputs) program over the expert's rows, two launches"))(
    registry.lazy("engined.ops.moe_grouped.triton:moe_grouped"))
registry.register("moe_grouped", "triton_dot", devices=("cuda",), description=(
    "Triton: per (expert, BLOCK_N outputs) program, BLOCK_M routes a tl.dot, W tiles "
    "dequantized once per BLOCK_M routes (prefill chunks)"))(
    registry.lazy("engined.ops.moe_grouped.triton_dot:moe_grouped"))
# On CUDA moe_grouped runs where a step has more than layers/moe.py's DECODE_ROWS (16) rows (a
# prefill chunk, a batch of over 16 decode rows), and for the expert cache's hits in a decode
# step with experts in RAM (HostExperts.run_cached, any rows): the tl.dot tiles read each
# expert tile once per 16 routes on the tensor cores (issue 29); the per-route kernel stays
# for A/Bs (KIMI_KERNELS=moe_grouped=triton).
registry.set_default("moe_grouped", "cuda", "triton_dot")
