"""Equivalence cases of the decode step's fused ops (the GPU's few-kernel step): the residual
norm, the stacked SwiGLU GEMV, the whole routed MoE, KDA's step, MLA's latent store."""
from dataclasses import replace

import torch

from engined.ops.int4_format import PackedInt4
from tests.ops.helpers import CASES, Case, experts, gemv_case, in_gpu_order, kind_tag, random_int4


def kda_decode_case(b: int, h: int, k: int, c: int, num_slots: int, dtype=torch.float32,
                    weight_dtype=None, seed=0) -> Case:
    """kda_decode: B rows on distinct slots of N-slot conv and state pools (both compared, unused
    slots included); activations in `dtype`, f_b, g_b, conv taps and norm weight in
    `weight_dtype` (default `dtype`). bf16 activations: the reference rounds the conv outputs,
    the low-rank products and o to bf16 where the kernel stays fp32, so a bf16-sized tolerance."""
    wd = weight_dtype or dtype
    w = h * k

    def make(gen):
        rand = lambda *shape, s=1.0: torch.randn(shape, generator=gen) * s  # noqa: E731
        qkv, low = rand(b, 3 * w).to(dtype), rand(b, 2 * k + h).to(dtype)
        f_b, g_b = rand(w, k, s=k ** -0.5).to(wd), rand(w, k, s=k ** -0.5).to(wd)
        conv_w, conv = rand(3, w, c, s=0.5).to(wd), rand(num_slots, 3, w, c - 1).to(dtype)
        S = rand(num_slots, h, k, k, s=0.1)
        slots = torch.randperm(num_slots, generator=gen)[:b]
        A_log, dt_bias, o_norm_w = rand(h, s=0.5), rand(w, s=0.5), (1 + rand(k, s=0.1)).to(wd)
        return qkv, low, f_b, g_b, conv_w, conv, S, slots, A_log, dt_bias, o_norm_w, 1e-5, k ** -0.5
    tag = "".join(f"-{name}{str(t).split('.')[-1]}" for name, t in (("act-", dtype), ("w-", wd))
                  if t != torch.float32)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    return Case(f"B{b}-H{h}-K{k}-C{c}-N{num_slots}{tag}", make, b * h * k * k, atol=tol, rtol=tol,
                seed=seed, updates=(5, 6))


KDA_DECODE = [
    kda_decode_case(1, 2, 16, 4, 3),
    kda_decode_case(3, 3, 24, 4, 5, seed=1),                   # K not a power of two
    kda_decode_case(8, 2, 16, 3, 9, seed=2),                   # conv width 3: a masked tap
    kda_decode_case(3, 4, 20, 2, 3, seed=3),                   # K = 20, width 2; every slot used
    kda_decode_case(3, 2, 16, 4, 6, weight_dtype=torch.bfloat16, seed=4),  # the CPU's weights
    kda_decode_case(3, 2, 16, 4, 6, torch.bfloat16, seed=5),   # the GPU's activations
]


def mla_latent_case(positions: list[int], r: int, p: int, block: int, dtype=torch.float32,
                    seed=0) -> Case:
    """mla_latent: row b's latent lands at positions[b] of its own shuffled blocks (tables
    padded with -1 past them); every other pool row random, so a stray store shows."""
    def make(gen):
        need = [pos // block + 1 for pos in positions]
        pool = torch.randn((sum(need) + 2, block, r + p), generator=gen).to(dtype)
        tables = torch.full((len(positions), max(need) + 1), -1, dtype=torch.int64)
        for b, ids in enumerate(torch.randperm(pool.shape[0], generator=gen)[:sum(need)].split(need)):
            tables[b, :len(ids)] = ids
        kv = (3 * torch.randn((len(positions), r + p), generator=gen)).to(dtype)
        weight = (1 + 0.2 * torch.randn(r, generator=gen)).to(dtype)
        return kv, weight, 1e-6, pool, tables, torch.tensor(positions)
    tag = "" if dtype == torch.float32 else f"-{str(dtype).split('.')[-1]}"
    # bf16: RMSNorm's two roundings, so one bf16 step apart at most (the interpreter truncates)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=2 ** -7)
    return Case(f"B{len(positions)}-R{r}-P{p}-BLOCK{block}-pos{'_'.join(map(str, positions))}{tag}",
                make, sum(positions) * (r + p), seed=seed, updates=(3,), **tol)


MLA_LATENT = [
    mla_latent_case([0], 24, 8, 16),                                      # the first position
    mla_latent_case([15, 16, 63], 40, 8, 16, seed=1),                     # block edges, R not 2^k
    mla_latent_case([0, 63, 64, 127, 5, 200, 191, 1], 48, 16, 64, seed=2),  # B = 8, blocks of 64
    mla_latent_case([31, 32, 17], 40, 24, 16, torch.bfloat16, seed=3),
]


def add_rmsnorm_case(b: int, d: int, with_delta: bool, dtype=torch.float32, seed=0) -> Case:
    """add_rmsnorm: h (updated in place) plus delta, or no delta (the first layer)."""
    def make(gen):
        h = (torch.randn((b, d), generator=gen) * 3).to(dtype)
        delta = torch.randn((b, d), generator=gen).to(dtype) if with_delta else None
        return h, delta, (1 + 0.2 * torch.randn(d, generator=gen)).to(dtype), 1e-5
    tag = "" if dtype == torch.float32 else f"-{str(dtype).split('.')[-1]}"
    # bf16: the sum and the output each round once, possibly to the other neighbour; the Triton
    # interpreter rounds fp32 -> bf16 by truncation (a GPU to nearest): a step each, and the
    # truncated sum moves the normalized value by up to a step more
    rtol = 1e-5 if dtype == torch.float32 else 2 ** -5
    return Case(f"B{b}-D{d}-{'delta' if with_delta else 'first'}{tag}", make, b * d,
                atol=1e-5, rtol=rtol, seed=seed, updates=(0,))


ADD_RMSNORM = [
    add_rmsnorm_case(1, 64, True),
    add_rmsnorm_case(3, 100, False, seed=1),            # D not a power of two, no delta
    add_rmsnorm_case(8, 2304, True, seed=2),            # Kimi's hidden size, 8 rows
    add_rmsnorm_case(2, 96, True, torch.bfloat16, seed=3),
]


def swiglu_case(m: int, f: int, k: int, group: int, dtype=torch.float32, seed=0,
                symmetric: bool = False) -> Case:
    """w4a16_swiglu: a stacked [2F, K] gate/up weight."""
    case = gemv_case(m, 2 * f, k, group, dtype, seed, symmetric)
    return replace(case, id=f"M{m}-F{f}-K{k}-G{group}" + case.id.split(f"G{group}")[1],
                   atol=1e-4 * k, rtol=1e-4 if dtype == torch.float32 else 2 ** -7)


SWIGLU = [
    swiglu_case(1, 32, 64, 32),
    swiglu_case(3, 20, 96, 16, seed=1, symmetric=True),  # F not a power of two, group 16
    swiglu_case(8, 64, 160, 32, seed=2),                 # 5 groups, 8 rows
    swiglu_case(2, 32, 128, 64, torch.bfloat16, seed=3, symmetric=True),
]


def moe_decode_case(b: int, e: int, k: int, d: int, inner: int, group: int, shared=True,
                    symmetric=True, dtype=torch.float32, seed=0, gpu_order=False) -> Case:
    """moe_decode: B rows routed from random logits (k of E, with a bias), the shared expert
    or none."""
    def make(gen):
        w1, w3 = (experts(gen, e, inner, d, group, symmetric) for _ in range(2))
        w2 = experts(gen, e, d, inner, group, symmetric)
        sgu = PackedInt4(group_size=group, **random_int4(gen, 2 * inner, d, group, symmetric=symmetric))
        sd = PackedInt4(group_size=group, **random_int4(gen, d, inner, group, symmetric=symmetric))
        f = torch.randn((b, d), generator=gen).to(dtype)
        logits, bias = torch.randn((b, e), generator=gen), torch.randn(e, generator=gen) * 0.1
        mats = [w1, w3, w2, sgu, sd]
        if gpu_order:
            mats = [in_gpu_order(w) for w in mats]
        return (f, logits, bias, k, True, 2.446, *mats[:3]) + (tuple(mats[3:]) if shared else (None, None))
    tag = ("" if dtype == torch.float32 else f"-{str(dtype).split('.')[-1]}") + kind_tag(symmetric)
    rtol = 2e-4 if dtype == torch.float32 else 2 ** -7
    tag += "-gpu-order" if gpu_order else ""
    return Case(f"B{b}-E{e}-k{k}-D{d}-I{inner}-G{group}{'' if shared else '-unshared'}{tag}", make,
                (k + 1) * 3 * d * inner * b, atol=2e-5 * (d + inner) * k, rtol=rtol, seed=seed,
                gpu_order=gpu_order)


MOE_DECODE = [
    moe_decode_case(1, 8, 2, 64, 32, 32),
    moe_decode_case(3, 16, 8, 96, 64, 32, seed=1),              # Kimi's top-8, 3 rows
    moe_decode_case(2, 5, 1, 64, 32, 16, shared=False, seed=2),  # top-1, no shared expert
    moe_decode_case(8, 12, 3, 64, 32, 32, symmetric=False, seed=3),  # 8 rows, mins
    moe_decode_case(4, 8, 4, 64, 32, 32, dtype=torch.bfloat16, seed=4),
    moe_decode_case(2, 8, 2, 64, 32, 32, seed=5, gpu_order=True),   # codes as a GPU holds them
]


CASES.update({"kda_decode": KDA_DECODE, "mla_latent": MLA_LATENT, "add_rmsnorm": ADD_RMSNORM,
              "w4a16_swiglu": SWIGLU, "moe_decode": MOE_DECODE})
