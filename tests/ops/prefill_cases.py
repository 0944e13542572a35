"""Equivalence cases of the prefill ops (CASES in tests/ops/helpers.py), and fla's chunk_kda
made of fla's naive functions, for the CPU (its Triton kernels do not run interpreted)."""
import warnings

import torch

from tests.ops.helpers import CASES, Case


def kda_prefill_case(t: int, h: int, k: int, v: int, dtype=torch.float32, seed=0) -> Case:
    """Short-conv outputs, raw gates and a nonzero state (a prefix cache's resume)."""
    def make(gen):
        q, kk, r = (torch.randn(t, h, k, generator=gen).to(dtype) for _ in range(3))
        vv, b = torch.randn(t, h, v, generator=gen).to(dtype), torch.randn(t, h, generator=gen).to(dtype)
        A_log, dt_bias = torch.randn(h, generator=gen) * 0.5, torch.randn(h * k, generator=gen)
        return [q, kk, vv, r, b, A_log, dt_bias, torch.randn(h, k, v, generator=gen) * 0.3, k ** -0.5]
    return Case(f"kda-prefill-t{t}-h{h}-k{k}-v{v}-{str(dtype)[6:]}", make, t * h * (3 * k + v),
                atol=2e-5, seed=seed, updates=(7,))


CASES["kda_prefill"] = [
    kda_prefill_case(2, 3, 16, 8),
    kda_prefill_case(17, 2, 32, 16, seed=1),
    kda_prefill_case(100, 3, 16, 24, seed=2),     # two chunks, the second odd
    kda_prefill_case(130, 2, 32, 32, torch.bfloat16, seed=3),
]


def fla_naive_chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state, *,
                        use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                        A_log, dt_bias, chunk_size):
    """chunk_kda's contract for these flags (its docstring), from fla's naive functions: the
    kda_prefill=fla variant on CPU tensors, where it stands in for fla.ops.kda.chunk_kda. The
    naive chunk form takes whole chunks only: the tail is padded with tokens that change
    nothing (k = 0, beta = 0, no decay) and their outputs dropped."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # fla: "Triton is not supported"
        from fla.ops.kda.gate import naive_kda_gate
        from fla.ops.kda.naive import naive_chunk_kda
    assert use_qk_l2norm_in_kernel and use_gate_in_kernel and use_beta_sigmoid_in_kernel
    assert output_final_state and initial_state.dtype == torch.float32
    norm = lambda x: x * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + 1e-6)  # noqa: E731  fla's l2norm_fwd
    t, pad = q.shape[1], -q.shape[1] % chunk_size
    tail = lambda x: torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))  # noqa: E731  [B, T, ...]
    o, final = naive_chunk_kda(tail(norm(q.float())), tail(norm(k.float())), tail(v.float()),
                               tail(naive_kda_gate(g, A_log, dt_bias)), tail(torch.sigmoid(beta.float())),
                               scale, initial_state.clone(), True, chunk_size)
    return o[:, :t], final
