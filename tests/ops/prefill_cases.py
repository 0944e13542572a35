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



def gated_rmsnorm_case(t: int, h: int, k: int, dtype=torch.float32, seed=0) -> Case:
    """KDA's output norm: heads' outputs, gate pre-activations of both signs, a weight near 1."""
    def make(gen):
        o, z = ((torch.randn(t, h, k, generator=gen) * 2).to(dtype) for _ in range(2))
        return o, z, (1 + 0.2 * torch.randn(k, generator=gen)).to(dtype), 1e-5
    # bf16: one rounding of the fp32 result, which the interpreter truncates (a GPU rounds to
    # nearest), after a sum taken in another order: a bf16 step either way
    rtol = 1e-5 if dtype == torch.float32 else 2 ** -7
    return Case(f"gated-rmsnorm-t{t}-h{h}-k{k}-{str(dtype)[6:]}", make, t * h * k, atol=1e-6,
                rtol=rtol, seed=seed)


CASES["gated_rmsnorm"] = [
    gated_rmsnorm_case(1, 1, 16),
    gated_rmsnorm_case(5, 3, 24, seed=1),          # rows not a multiple of the tile, K not 2^n
    gated_rmsnorm_case(33, 2, 128, torch.bfloat16, seed=2),   # Kimi-Linear's K, bf16
]


def short_conv_case(t: int, c: int, w: int, parts: int, dtype=torch.float32, seed=0) -> Case:
    """A chunk after a nonzero window (a resumed sequence); the window is updated in place."""
    def make(gen):
        x = torch.randn(t, c, generator=gen).to(dtype)
        weight = (torch.randn(c, 1, w, generator=gen) * 0.5).to(dtype)
        return x, weight, torch.randn(c, w - 1, generator=gen).to(dtype), parts
    rtol = 1e-5 if dtype == torch.float32 else 2 ** -7
    return Case(f"short-conv-t{t}-c{c}-w{w}-p{parts}-{str(dtype)[6:]}", make, t * c * w,
                atol=1e-6, rtol=rtol, seed=seed, updates=(2,))


CASES["short_conv"] = [
    short_conv_case(1, 12, 4, 3),                  # one token: three taps from the window
    short_conv_case(2, 6, 4, 3, seed=1),           # fewer tokens than the window: it keeps one
    short_conv_case(37, 150, 4, 3, seed=2),        # two token tiles, channels past one tile
    short_conv_case(40, 96, 4, 3, torch.bfloat16, seed=3),
    short_conv_case(9, 10, 2, 1, seed=4),          # another width, one part
]


def moe_route_case(t: int, e: int, k: int, renormalize: bool, seed=0) -> Case:
    """Router logits and a correction bias large enough to change the picks."""
    def make(gen):
        logits = torch.randn(t, e, generator=gen) * 2
        bias = (torch.randn(e, generator=gen) * 0.3).to(torch.bfloat16)
        # picks start at -1: a pick a variant fails to store cannot pass for expert 0
        return logits, bias, k, renormalize, 2.446, torch.full((t, k), -1, dtype=torch.int64)
    return Case(f"moe-route-t{t}-e{e}-k{k}{'-renorm' if renormalize else ''}", make, t * e,
                atol=1e-6, rtol=1e-5, seed=seed, updates=(5,))


CASES["moe_route"] = [
    moe_route_case(1, 8, 2, True),
    moe_route_case(9, 40, 3, False, seed=1),       # E not a power of two, no renormalizing
    moe_route_case(33, 256, 8, True, seed=2),      # Kimi-Linear: top-8 of 256
    moe_route_case(4, 16, 1, True, seed=3),        # k = 1: nothing to renormalize
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
