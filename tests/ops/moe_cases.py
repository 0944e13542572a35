"""Equivalence cases of the whole MoE ops (moe_grouped, moe_grouped_w4a8): tokens routed
among INT4 expert stacks, decode rows to prefill chunks (tests/ops/helpers.py's CASES)."""
import torch

from tests.ops.helpers import CASES, Case, experts, in_gpu_order, kind_tag


def moe_case(e: int, t: int, k: int, d: int, inner: int, group: int, seed=0, symmetric=False,
             dtype=torch.float32, ids=None, gpu_order=False) -> Case:
    """moe_grouped: T tokens with k picks each among E experts (ids: fixed picks [T][k])."""
    order = in_gpu_order if gpu_order else (lambda w: w)
    def make(gen):
        w1, w3 = (order(experts(gen, e, inner, d, group, symmetric)) for _ in range(2))
        w2 = order(experts(gen, e, d, inner, group, symmetric))
        x = torch.randn((t, d), generator=gen).to(dtype)
        picks = (torch.tensor(ids) if ids is not None else
                 torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]))
        weights = torch.rand((t, k), generator=gen)
        return x, w1, w3, w2, picks, weights
    tag = "" if dtype == torch.float32 else f"-{str(dtype).split('.')[-1]}"
    return Case(f"E{e}-T{t}-k{k}-D{d}-I{inner}-G{group}{tag}{kind_tag(symmetric)}"
                f"{'-gpu-order' if gpu_order else ''}", make, e * 3 * d * inner,
                atol=2e-5 * (d + inner) * k, rtol=2e-4, seed=seed, gpu_order=gpu_order, group=group)


MOE = [
    moe_case(4, 1, 2, 64, 32, 32),                            # one decode token
    moe_case(5, 3, 2, 96, 64, 32, seed=1),                    # experts shared by some tokens
    moe_case(6, 8, 4, 64, 96, 32, seed=2),                    # a batch of 8 rows
    moe_case(3, 11, 2, 64, 32, 32, seed=3),                   # > 8 rows of one expert: chunks
    moe_case(4, 4, 2, 160, 64, 32, seed=4),                   # 5 groups: odd group count
    moe_case(3, 3, 2, 48, 32, 16, seed=5),                    # group 16: the scalar C kernel
    # D and I multiples of 64: the C variant's int16 dots, where AVX2 or AVX-512 VNNI runs
    moe_case(8, 1, 4, 128, 64, 32, seed=6, symmetric=True),   # a decode token, Kimi's scheme
    moe_case(8, 8, 4, 128, 128, 64, seed=7, symmetric=True),  # a batch, group 64
    moe_case(5, 5, 1, 64, 32, 32, seed=6, ids=[[2], [2], [2], [0], [2]]),  # top-1, one hot expert
    moe_case(5, 3, 2, 96, 64, 32, seed=7, symmetric=True),
    moe_case(3, 11, 2, 64, 32, 32, seed=8, symmetric=True),
    moe_case(4, 4, 2, 64, 32, 32, seed=9, dtype=torch.bfloat16),
    # prefill chunks: more routes an expert than one BLOCK_M of the tl.dot variant, GPU order
    moe_case(2, 20, 2, 64, 96, 32, seed=10),
    moe_case(3, 24, 2, 64, 32, 16, seed=11, dtype=torch.bfloat16, gpu_order=True),
    moe_case(2, 18, 2, 96, 64, 32, seed=12, symmetric=True, gpu_order=True),
]


def moe_w4a8_case(*args, **kw) -> Case:
    """moe_grouped_w4a8: moe_case's inputs. h is rounded to int8 after fp32 sums that C orders
    otherwise, so an h value at a tie may land one code away (see its reference)."""
    return moe_case(*args, **kw)


MOE_W4A8 = [
    moe_w4a8_case(4, 1, 2, 64, 128, 32),                      # one decode token: 4 rows per x load
    moe_w4a8_case(8, 1, 8, 256, 128, 32, seed=1),             # top-8 of 8: every expert once
    moe_w4a8_case(5, 3, 2, 96, 64, 32, seed=2),               # D % 64 == 32: x unpaired
    moe_w4a8_case(6, 8, 4, 128, 96, 32, seed=3),              # 8 rows; I % 64 == 32: h unpaired
    moe_w4a8_case(3, 11, 2, 64, 64, 32, seed=4),              # > 8 rows of one expert: chunks
    moe_w4a8_case(4, 4, 2, 192, 128, 64, seed=5),             # group 64
    moe_w4a8_case(5, 5, 1, 64, 64, 32, seed=6, ids=[[2], [2], [2], [0], [2]]),
    moe_w4a8_case(5, 3, 2, 128, 64, 32, seed=7, symmetric=True),
    moe_w4a8_case(4, 4, 2, 64, 64, 32, seed=8, dtype=torch.bfloat16),
]


CASES["moe_grouped"] = MOE
CASES["moe_grouped_w4a8"] = MOE_W4A8
