"""kda_prefill through fla-core's `chunk_kda`, the Triton chunked KDA prefill that vLLM and
SGLang serve Kimi-Linear with. Its flags fold the q/k L2 norms (eps 1e-6), the softplus decay
gate (-exp(A_log) softplus(r + dt_bias)) and beta's sigmoid into its kernels, so the layer
hands it the short convolutions' outputs as they are (bf16 on a GPU). The sequence's state
goes in as `initial_state` (fp32, [1, H, K, V]) and the final state is copied back into it.

Memory traffic per chunk of 64 tokens and head: q, k, v, r (4 x 64 x 128 activations) read
once, the K x V fp32 state read and written once per chunk; no [T, T] or [C, C, K] tensor.
"""
import torch

from engined.ops import registry
from engined.ops.kda_prefill.reference import CHUNK, check_inputs


def chunk_kda(*args, **kwargs):
    """fla's kernel, imported on first use (fla imports triton; a test may stand in for it)."""
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda
    except ImportError as e:
        raise registry.KernelError(
            f"kda_prefill=fla needs fla-core ({e}): pip install fla-core==0.6.0 (on the GPU "
            f"image: make gpu-carry, then carry .gpu-carry/wheels); KIMI_KERNELS="
            f"kda_prefill=reference runs our chunk form instead") from e
    return fla_chunk_kda(*args, **kwargs)


def kda_prefill(q, k, v, r, b, A_log, dt_bias, S, scale: float, out=None) -> torch.Tensor:
    check_inputs(q, k, v, r, b, A_log, dt_bias, S)
    o, final = chunk_kda(q[None], k[None], v[None], r[None], b[None], scale=scale,
                         initial_state=S[None], output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                         use_beta_sigmoid_in_kernel=True, A_log=A_log.float(),
                         dt_bias=dt_bias.float(), chunk_size=CHUNK)
    S.copy_(final[0])
    return o[0] if out is None else out.copy_(o[0])                # [T, H, V], q's dtype
