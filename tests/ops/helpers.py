"""Equivalence cases per op (used by tests/ops/test_equivalence.py and the cpu_c tests)."""
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Callable

import torch

from engined.ops import int4_format
from engined.ops.int4_format import PackedInt4
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable  # generator -> positional args for the op
    elements: int   # weights touched: keeps the Triton interpreter fast
    atol: float
    rtol: float = 1e-4
    seed: int = 0
    updates: tuple[int, ...] = ()   # positions of arguments the op updates in place
    gpu_order: bool = False         # INT4 codes in the GPU kernels' order: GPU variants only
    group: int = 0                  # an INT4 weight's group size (0: none or not one weight)


def random_int4(gen: torch.Generator, n: int, k: int, group: int, lead=(),
                symmetric: bool = False) -> dict:
    """Every byte value, scales of both signs, mins spread around zero (None: symmetric)."""
    shape = (*lead, n)
    qweight = torch.randint(0, 256, (*shape, k // 2), generator=gen, dtype=torch.uint8)
    scales = (torch.randn((*shape, k // group), generator=gen) * 0.05).half()
    mins = None if symmetric else (torch.randn((*shape, k // group), generator=gen) * 0.3).half()
    return dict(qweight=qweight, scales=scales, mins=mins)


def kind_tag(symmetric: bool) -> str:
    return "-sym" if symmetric else ""


def gemv_case(m: int, n: int, k: int, group: int, dtype=torch.float32, seed=0,
              symmetric: bool = False, gpu_order: bool = False) -> Case:
    def make(gen):
        w = PackedInt4(group_size=group, **random_int4(gen, n, k, group, symmetric=symmetric))
        return torch.randn((m, k), generator=gen).to(dtype), in_gpu_order(w) if gpu_order else w
    tag = ("" if dtype == torch.float32 else f"-{str(dtype).split('.')[-1]}") + kind_tag(symmetric)
    return Case(f"M{m}-N{n}-K{k}-G{group}{tag}{'-gpu-order' if gpu_order else ''}", make, n * k,
                atol=2e-5 * k, seed=seed, gpu_order=gpu_order, group=group)


def in_gpu_order(w):
    """The same weight (a PackedInt4 or an expert stack) with its codes in the GPU's order."""
    return replace(w, qweight=int4_format.gpu_order(w.qweight, w.group_size), gpu_order=True)


GEMV = [
    gemv_case(1, 40, 96, 32),
    gemv_case(3, 40, 96, 32, seed=1),
    gemv_case(8, 40, 96, 32, seed=2),
    gemv_case(1, 1, 64, 32, seed=3),            # N = 1
    gemv_case(2, 33, 160, 32, seed=4),          # 5 groups: odd group count
    gemv_case(3, 24, 96, 16, seed=5),           # group 16: the scalar C kernel
    gemv_case(5, 17, 192, 64, seed=6),          # group 64: two blocks per group
    gemv_case(11, 40, 96, 32, seed=7),          # more than 8 rows: runs in chunks
    # bf16 rows give bf16 outputs: one rounding of the fp32 sum, either side of a half ulp
    replace(gemv_case(2, 40, 96, 32, torch.bfloat16, seed=8), rtol=2 ** -7),
    gemv_case(1, 576, 576, 32, seed=9),         # SmolLM2 shapes
    gemv_case(1, 192, 576, 32, seed=10),
    gemv_case(1, 1536, 576, 32, seed=11),
    gemv_case(1, 576, 1536, 32, seed=12),
    # symmetric weights (no mins): every kernel path again
    gemv_case(1, 40, 96, 32, seed=13, symmetric=True),
    gemv_case(8, 40, 96, 32, seed=14, symmetric=True),
    gemv_case(2, 33, 160, 32, seed=15, symmetric=True),       # odd group count
    gemv_case(3, 24, 96, 16, seed=16, symmetric=True),        # the scalar C kernel
    gemv_case(5, 17, 192, 64, seed=17, symmetric=True),       # two blocks per group
    gemv_case(11, 40, 96, 32, seed=18, symmetric=True),       # chunks of 8 rows
    gemv_case(1, 576, 1536, 32, seed=19, symmetric=True),     # many groups (SIMD tails)
    # codes in the GPU kernels' order (repacked at load on a GPU): the Triton variant only
    gemv_case(1, 40, 96, 32, seed=20, symmetric=True, gpu_order=True),
    gemv_case(3, 33, 160, 32, seed=21, gpu_order=True),
    replace(gemv_case(2, 24, 128, 64, torch.bfloat16, seed=22, symmetric=True, gpu_order=True),
            rtol=2 ** -6),                                    # interpreted: bf16 truncated
    gemv_case(1, 17, 96, 16, seed=23, gpu_order=True),
]


GEMM = [  # prefill rows: the C GEMM's register blocks (6 rows x 16 outputs), tiles of 256 inputs
    gemv_case(9, 40, 96, 32),                   # one block of 6 rows and a tail of 3
    gemv_case(1, 40, 96, 32, seed=1),           # M = 1 runs here too
    gemv_case(13, 17, 192, 64, seed=2),         # N < 16: a partial tile of weight rows
    gemv_case(12, 1, 64, 32, seed=3),           # N = 1
    gemv_case(7, 33, 160, 32, seed=4),          # 5 groups: odd group count
    gemv_case(20, 24, 96, 16, seed=5),          # group 16
    gemv_case(10, 20, 30, 6, seed=6),           # group 6: K % 8 != 0 (the portable decode)
    gemv_case(40, 50, 600, 2, seed=7),          # group 2; K spans 3 tiles, the last partial
    gemv_case(17, 70, 576, 96, seed=8),         # a group straddles two tiles of 256 inputs
    gemv_case(300, 48, 320, 32, seed=9),        # M > 256: two passes of rows over each tile
    gemv_case(11, 40, 96, 32, torch.bfloat16, seed=10),
    gemv_case(64, 192, 576, 32, seed=11),       # SmolLM2 shapes
    gemv_case(33, 576, 1536, 32, seed=12),
    gemv_case(9, 40, 96, 32, seed=13, symmetric=True),
    gemv_case(13, 17, 192, 64, seed=14, symmetric=True),
    gemv_case(10, 20, 30, 6, seed=15, symmetric=True),
    gemv_case(300, 48, 320, 32, seed=16, symmetric=True),
    gemv_case(33, 576, 1536, 32, seed=17, symmetric=True),
    # the GPU's code order (the Triton tiles), rows past one BLOCK_M, N past one BLOCK_N
    gemv_case(70, 80, 128, 32, seed=18, gpu_order=True),
    gemv_case(20, 40, 96, 16, torch.bfloat16, seed=19, gpu_order=True, symmetric=True),
    gemv_case(9, 65, 256, 64, torch.bfloat16, seed=20, gpu_order=True),
    gemv_case(17, 24, 64, 8, seed=21, symmetric=True),         # group 8: one word a group
]


def w4a8_case(m: int, n: int, k: int, group: int, dtype=torch.float32, seed=0,
              symmetric: bool = False) -> Case:
    """The reference quantizes x exactly as C does, so only fp32 accumulation differs."""
    return replace(gemv_case(m, n, k, group, dtype, seed, symmetric), atol=1e-6 * k, rtol=1e-5)


W4A8 = [
    w4a8_case(1, 40, 96, 32),
    w4a8_case(2, 33, 160, 32, seed=1),                  # 5 groups: odd group count
    w4a8_case(3, 24, 96, 32, seed=2, symmetric=True),
    w4a8_case(4, 1, 64, 32, seed=3),                    # N = 1
    w4a8_case(5, 17, 192, 64, seed=4),                  # group 64: two blocks per group
    w4a8_case(6, 40, 320, 64, seed=5, symmetric=True),  # 5 groups of 64
    w4a8_case(7, 40, 96, 32, torch.bfloat16, seed=6),
    w4a8_case(8, 40, 96, 32, seed=7, symmetric=True),
    w4a8_case(9, 17, 192, 64, seed=8),                  # more than 8 rows: two passes
    w4a8_case(11, 40, 96, 32, seed=9, symmetric=True),
    w4a8_case(1, 576, 1536, 32, seed=10),               # SmolLM2 shapes
    w4a8_case(8, 1536, 576, 32, seed=11, symmetric=True),
    # one row with K % 64 == 0: AVX2 runs 4 weight rows per x load, blocks in pairs
    w4a8_case(1, 43, 576, 32, seed=12),                 # N % 4 = 3; 18 blocks: a tail of 2
    w4a8_case(1, 41, 576, 32, seed=13, symmetric=True),  # N % 4 = 1, symmetric
    w4a8_case(1, 40, 256, 32, seed=14),                 # exactly 8 blocks
    w4a8_case(1, 36, 640, 64, seed=15),                 # group 64: mins per group, after
    w4a8_case(1, 38, 320, 64, seed=16, symmetric=True),  # 10 blocks of 5 groups
]


def tiles_case(m: int, n: int, k: int, group: int, dtype=torch.float32, seed=0,
               symmetric: bool = False) -> Case:
    """w4a8_tiles: a w4a8 case whose weight is in the CPU's tiles (N a multiple of 16)."""
    case = w4a8_case(m, n, k, group, dtype, seed, symmetric)

    def make(gen):
        x, w = case.make(gen)
        return x, int4_format.to_tiles(w)
    return replace(case, id=case.id + "-tiles", make=make)


TILES = [
    tiles_case(1, 16, 32, 32),                           # one tile, one block
    tiles_case(1, 48, 96, 32, seed=1),                   # 3 tiles: a 2-tile and a 1-tile block
    tiles_case(2, 80, 160, 32, seed=2, symmetric=True),  # 5 tiles at 2 rows: 4 + 1
    tiles_case(3, 32, 192, 64, seed=3),                  # group 64: two blocks per group
    tiles_case(4, 64, 320, 64, seed=4, symmetric=True),  # 5 groups of 64
    tiles_case(5, 96, 96, 32, torch.bfloat16, seed=5),   # rows 4 + 1
    tiles_case(8, 48, 256, 128, seed=6),                 # a verify step of 7 drafts
    tiles_case(13, 32, 96, 32, seed=7, symmetric=True),  # past MAX_ROWS: one call still
    tiles_case(70, 64, 128, 32, seed=8),                 # prefill: two chunks of 64 rows
    tiles_case(1, 576, 1536, 32, seed=9, symmetric=True),  # SmolLM2 shapes
    tiles_case(6, 960, 576, 32, seed=10),
]


def random_q8(gen: torch.Generator, n: int, k: int):
    """GGUF Q8_0: every int8 code (-128 included) and scales of both signs."""
    from engined.ops.q8_gemv.reference import PackedQ8
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = ((torch.rand(n, k // 32, generator=gen) - 0.3) * 0.02).half()
    return PackedQ8(q, scales)


def q8_case(m: int, n: int, k: int, dtype=torch.float32, seed=0) -> Case:
    """The reference quantizes x exactly as C does, so only fp32 accumulation differs."""
    def make(gen):
        return (torch.randn(m, k, generator=gen).to(dtype), random_q8(gen, n, k))
    return Case(f"m{m}-n{n}-k{k}-{str(dtype).split('.')[-1]}", make, n * k, atol=1e-6 * k,
                rtol=1e-5, seed=seed)


Q8 = [
    q8_case(1, 40, 96),
    q8_case(2, 33, 160, seed=1),                 # 5 blocks: a partial group of 8
    q8_case(4, 1, 64, seed=2),                   # N = 1
    q8_case(7, 40, 96, torch.bfloat16, seed=3),
    q8_case(9, 17, 288, seed=4),                 # more than 8 rows: two passes; 9 blocks
    q8_case(1, 1000, 576, seed=5),               # SmolLM2's head width
    q8_case(8, 700, 576, seed=6),
]


def q8_tiles_case(m: int, n: int, k: int, dtype=torch.float32, seed=0) -> Case:
    """q8_tiles: a q8 case whose weight is in the CPU's tiles (N a multiple of 16)."""
    case = q8_case(m, n, k, dtype, seed)

    def make(gen):
        x, w = case.make(gen)
        return x, w.in_tiles()
    return replace(case, id=case.id + "-tiles", make=make)


Q8_TILES = [
    q8_tiles_case(1, 16, 32),                   # one tile, one block
    q8_tiles_case(3, 48, 96, seed=1),           # 3 tiles: blocks of 2 and 1
    q8_tiles_case(5, 80, 160, torch.bfloat16, seed=2),
    q8_tiles_case(9, 32, 288, seed=3),          # past MAX_ROWS in one call; 9 blocks
    q8_tiles_case(70, 64, 64, seed=4),          # prefill-sized: two chunks of rows
    q8_tiles_case(8, 1024, 576, seed=5),        # SmolLM2's head width, a verify step
]


def same_bits_on_1_and_2_threads(fn: Callable, *args):
    """fn(*args) under the C helper's 1 and 2 threads: the same bits (the pool's split)."""
    from engined.ops.w4a16_gemv import cpu_c
    try:
        cpu_c.set_num_threads(1)
        one = fn(*args)
        cpu_c.set_num_threads(2)
        assert torch.equal(fn(*args), one)
    finally:
        cpu_c.set_num_threads(None)


def experts(gen, e, n, k, group, symmetric: bool = False) -> PackedInt4Experts:
    return PackedInt4Experts(group_size=group, **random_int4(gen, n, k, group, lead=(e,),
                                                            symmetric=symmetric))


def routed_case(op: str, e: int, ids: list[int], shared_x: bool, n: int, k: int, group: int,
                seed=0, symmetric: bool = False) -> Case:
    """Grouped GEMV / SwiGLU: `ids` are the router's picks (duplicates allowed)."""
    def make(gen):
        stacks = [experts(gen, e, n, k, group, symmetric)
                  for _ in range(2 if op == "moe_swiglu" else 1)]
        x = torch.randn((1 if shared_x else len(ids), k), generator=gen)
        return (x, *stacks, torch.tensor(ids))
    tag = "shared" if shared_x else "per-route"
    return Case(f"E{e}-R{len(ids)}-{tag}-N{n}-K{k}-G{group}{kind_tag(symmetric)}", make,
                len(ids) * n * k, atol=2e-5 * k, seed=seed)


def routed(op: str) -> list[Case]:
    return [
        routed_case(op, 5, [3], True, 40, 96, 32),
        routed_case(op, 5, [4, 0, 2], False, 40, 96, 32, seed=1),
        routed_case(op, 9, [8, 1, 1, 5, 0, 2, 7, 3], True, 33, 160, 32, seed=2),  # duplicate id
        routed_case(op, 4, [2, 3], False, 1, 64, 32, seed=3),                       # N = 1
        routed_case(op, 3, [0, 2], True, 24, 96, 16, seed=4),                       # group 16
        routed_case(op, 6, [5, 1, 4, 0, 3, 2, 1, 0], False, 64, 512, 32, seed=5),
        routed_case(op, 5, [4, 0, 2], False, 40, 96, 32, seed=6, symmetric=True),
        routed_case(op, 9, [8, 1, 1, 5], True, 33, 160, 32, seed=7, symmetric=True),
        routed_case(op, 3, [0, 2], True, 24, 96, 16, seed=8, symmetric=True),     # group 16
    ]


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


def kda_case(b: int, h: int, k: int, v: int, num_slots: int, seed=0) -> Case:
    """kda_step: B rows on distinct slots of an N-slot pool (unused slots must stay as they are)."""
    def make(gen):
        q, kk = (torch.nn.functional.normalize(torch.randn((b, h, k), generator=gen), dim=-1)
                 for _ in range(2))
        g = -torch.rand((b, h, k), generator=gen) * 0.5
        vv = torch.randn((b, h, v), generator=gen)
        beta = torch.rand((b, h), generator=gen)
        states = torch.randn((num_slots, h, k, v), generator=gen) * 0.1
        slots = torch.randperm(num_slots, generator=gen)[:b]
        return q, kk, vv, g, beta, states, slots, k ** -0.5
    return Case(f"B{b}-H{h}-K{k}-V{v}-N{num_slots}", make, b * h * k * v, atol=1e-5, rtol=1e-5,
                seed=seed, updates=(5,))


KDA = [
    kda_case(1, 2, 16, 16, 3),
    kda_case(3, 4, 32, 32, 8, seed=1),
    kda_case(8, 2, 16, 24, 9, seed=2),     # V not a power of two
    kda_case(2, 3, 20, 8, 2, seed=3),      # K not a power of two; every slot used
]


def paged_mla_case(lengths: list[int], h: int, r: int, p: int, block: int, seed=0) -> Case:
    """paged_mla_decode: rows of the given lengths on shuffled blocks of a pool, tables padded
    with -1 past each row's blocks (and one column past the longest), free blocks NaN, and the
    rows of a row's last block past its length large (finite: the pool zeroes what it hands out)."""
    def make(gen):
        need = [-(-n // block) for n in lengths]
        num_blocks = sum(need) + 2
        pool = torch.randn((num_blocks, block, r + p), generator=gen)
        order = torch.randperm(num_blocks, generator=gen)
        tables = torch.full((len(lengths), max(need) + 1), -1, dtype=torch.int64)
        for b, ids in enumerate(order[:sum(need)].split(need)):
            tables[b, :len(ids)] = ids
            pool[ids[-1], (lengths[b] - 1) % block + 1:] = 1e3
        pool[order[sum(need):]] = float("nan")
        q_lat = torch.randn((len(lengths), h, r), generator=gen)
        q_rope = torch.randn((len(lengths), h, p), generator=gen)
        return q_lat, q_rope, pool, tables, torch.tensor(lengths), (r + p) ** -0.5
    return Case(f"B{len(lengths)}-H{h}-R{r}-P{p}-BLOCK{block}-L{'_'.join(map(str, lengths))}",
                make, sum(lengths) * h * (r + p), atol=1e-5, rtol=1e-4, seed=seed)


PAGED_MLA = [
    paged_mla_case([1], 2, 16, 8, 16),                                # one key
    paged_mla_case([5, 16, 17, 1], 3, 32, 16, 16, seed=1),            # block edges, odd heads
    paged_mla_case([33, 2, 48, 9, 1, 20, 64, 15], 4, 24, 8, 16, seed=2),  # B = 8, R not 2^k
    paged_mla_case([70, 3], 2, 64, 32, 64, seed=3),                   # blocks of 64
    paged_mla_case([100], 17, 16, 8, 16, seed=4),                     # two head blocks
    # the Triton variant's key ranges (128 keys at least): 9 per row here, 76 keys in the last
    # of the long row's, the rest of the short rows' empty
    paged_mla_case([1100, 5, 300, 1], 2, 24, 8, 16, seed=5),
    paged_mla_case([700, 64], 3, 40, 8, 64, seed=6),                  # 6 ranges, blocks of 64
]


def llama_layer_case(positions: list[int], d: int, heads: int, kv_heads: int, hd: int,
                     inner: int, gemv="w4a16_gemv", symmetric=False, seed=0) -> Case:
    """llama_decode_layer: row b at positions[b] of its own cache (S_max a little past it),
    cache rows before it random, the row itself and those after it 1e3 (finite, so a read
    past the position shows as a wrong softmax rather than a NaN the harness would blame)."""
    from engined.layers.rope import RotaryEmbedding
    from engined.ops.llama_decode_layer.reference import LlamaLayer

    def linear(gen, n, k):  # weights ~ 1/sqrt(k), so activations stay near unit size
        parts = random_int4(gen, n, k, 32, symmetric=symmetric)
        scale = 4 / k ** 0.5
        parts["scales"] = (parts["scales"].float() * scale).half()
        if parts["mins"] is not None:
            parts["mins"] = (parts["mins"].float() * scale).half()
        w = PackedInt4(group_size=32, **parts)
        return int4_format.to_tiles(w) if gemv == "w4a8_tiles" else w

    def make(gen):
        rows = len(positions)
        h = torch.randn((rows, d), generator=gen)
        norms = [1 + 0.1 * torch.randn(d, generator=gen) for _ in range(2)]
        layer = LlamaLayer(norms[0], norms[1], 1e-5, linear(gen, (heads + 2 * kv_heads) * hd, d),
                           linear(gen, d, heads * hd), linear(gen, 2 * inner, d),
                           linear(gen, d, inner), heads, kv_heads, hd, gemv)
        kv = []
        for pos in positions:
            cache = torch.full((2, pos + 3, kv_heads, hd), 1e3, dtype=torch.float16)
            cache[:, :pos] = torch.randn((2, pos, kv_heads, hd), generator=gen).half()
            kv.append(cache)
        cos, sin = RotaryEmbedding(hd, 10000.0).at_positions(positions)
        return h, layer, cos.clone(), sin.clone(), kv, list(positions)
    kind = f"{gemv.removesuffix('_gemv').replace('_', '-')}{kind_tag(symmetric)}"
    return Case(f"B{len(positions)}-D{d}-H{heads}-KVH{kv_heads}-hd{hd}-F{inner}-{kind}-"
                f"P{'_'.join(map(str, positions))}", make, d * inner * 3,
                atol=2e-4, rtol=1e-4, seed=seed, updates=(4,))


LLAMA_LAYER = [
    llama_layer_case([0], 64, 4, 2, 16, 96),                               # the first token
    llama_layer_case([5, 70, 0], 64, 4, 2, 16, 96, seed=1),                # > one key chunk
    llama_layer_case([3, 1, 4, 1, 5, 9, 2, 6], 96, 6, 2, 32, 64, seed=2),  # B = 8, groups of 3
    llama_layer_case([130], 64, 2, 2, 32, 96, "w4a16_gemv", True, seed=3),  # no GQA, symmetric
    llama_layer_case([0], 64, 4, 2, 16, 96, "w4a8_gemv", seed=4),
    llama_layer_case([7, 66, 2], 96, 6, 3, 16, 160, "w4a8_gemv", seed=5),
    llama_layer_case([40], 576, 9, 3, 64, 1536, "w4a8_gemv", seed=6),     # SmolLM2 shapes
    # long rows: keys cut into ranges (256 at least, 16 at most per KV head) and merged
    llama_layer_case([300, 5, 1100], 64, 4, 2, 16, 96, seed=7),
    llama_layer_case([4200], 64, 8, 2, 8, 96, "w4a8_gemv", seed=8),       # 16 ranges of 263
    llama_layer_case([700], 64, 8, 2, 12, 96, seed=9),                    # hd 12: portable loads
    llama_layer_case([3, 9, 0], 64, 4, 2, 16, 96, "w4a8_tiles", seed=10),
    llama_layer_case([40, 41, 42, 43, 44], 576, 9, 3, 64, 1536, "w4a8_tiles", True, seed=11),
    # AVX2 attention: groups of 5 (a pass of 3 heads, then 2), hd 40 (32 elements a pass, then
    # 8); a long row's task takes every KV head, a short one's a KV head each
    llama_layer_case([900, 33], 64, 20, 4, 40, 96, seed=12),
    llama_layer_case([600], 64, 40, 4, 8, 96, seed=13),   # 40 heads: over a task's 32
    # AVX-512 attention (hd % 16 == 0): groups of 4 (3 heads, then 1), long rows in ranges,
    # keys past the last 8 (the AVX2 kernel's); hd 48, a pass of 3 x 16 elements
    llama_layer_case([300, 5, 1100], 64, 8, 2, 32, 96, "w4a8_tiles", seed=14),
    llama_layer_case([77, 130], 96, 4, 1, 48, 64, "w4a8_tiles", seed=15),
]


CASES = {"w4a16_gemv": GEMV, "w4a16_gemm": GEMM, "w4a8_gemv": W4A8, "w4a8_tiles": TILES, "q8_gemv": Q8, "q8_tiles": Q8_TILES, "moe_grouped": MOE,
         "moe_grouped_w4a8": MOE_W4A8, "kda_step": KDA, "llama_decode_layer": LLAMA_LAYER, "paged_mla_decode": PAGED_MLA, "w4a16_grouped_gemv": routed("w4a16_grouped_gemv"),
         "moe_swiglu": routed("moe_swiglu")}

import tests.ops.decode_cases  # noqa: E402,F401  (adds the decode step's fused ops to CASES)
import tests.ops.prefill_cases  # noqa: E402,F401  (adds the prefill ops to CASES)


def SMALL_ENOUGH_FOR_INTERPRETER(case: Case) -> bool:  # noqa: N802 (reads as a constant rule)
    return case.elements <= 256 * 512


def interpreter_ready() -> bool:
    """Whether the loaded triton was imported in interpreter mode (tl.zeros, tl.sum are
    jit functions, decorated once when triton.language is first imported)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(tl.zeros, InterpretedFunction)


def run_fresh(test_file: str, keyword: str):
    """Run `-k keyword` of a test file in a child whose TRITON_INTERPRET=1 precedes triton."""
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           test_file, "-k", keyword], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-2000:]
