"""Equivalence cases per op (used by tests/ops/test_equivalence.py and the cpu_c tests)."""
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Callable

import torch

from engined.ops import int4_format, registry
from engined.ops.int4_format import PackedInt4
from engined.ops.moe_grouped_w4a8.reference import rounded_experts
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
    """w4a8_tiles and w4a16_tiles: a w4a8 case whose weight is in the CPU's tiles (N a multiple
    of 16)."""
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


def banks_and_tiles(seed: int, e: int, d: int, inner: int, group: int, symmetric: bool):
    """A MoE layer's (w1, w3, w2) stacks of e experts (D x I, multiples of 16: whole tiles),
    as rows, and the same in the CPU's tiles."""
    gen = torch.Generator().manual_seed(seed)
    w1, w3 = (experts(gen, e, inner, d, group, symmetric) for _ in range(2))
    rows = (w1, w3, experts(gen, e, d, inner, group, symmetric))
    return rows, tuple(bank.to_tiles() for bank in rows)


def shared_routes(seed: int, tokens: int, d: int, e: int, k: int):
    """(x [T, d], ids [T, k], weights [T, k]): every row chose one expert (a segment of
    `tokens` rows), rows 2 and 3 another of row 0's."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)])
    ids[1:, 0] = ids[0, 0]
    ids[2:4, 1] = ids[0, 1]
    return torch.randn(tokens, d, generator=gen), ids, torch.rand(tokens, k, generator=gen)


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


CASES = {"w4a16_gemv": GEMV, "w4a16_gemm": GEMM, "w4a8_gemv": W4A8, "w4a8_tiles": TILES,
         "w4a16_tiles": TILES,
         "q8_gemv": Q8, "q8_tiles": Q8_TILES, "w4a16_grouped_gemv": routed("w4a16_grouped_gemv"),
         "moe_swiglu": routed("moe_swiglu")}

import tests.ops.moe_cases  # noqa: E402,F401  (adds the whole MoE ops to CASES)
import tests.ops.layer_cases  # noqa: E402,F401  (adds KDA's step, paged MLA, the Llama layer)
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


def distances(got, x, banks, ids, weights) -> tuple[float, float, torch.Tensor]:
    """got's mean distance, relative to the reference's mean magnitude, from the experts with
    x and h rounded to int16 per block (rounded_experts) and from the fp32 reference ->
    (to_rounded, to_plain, the reference's output)."""
    rounded = rounded_experts(x, *banks, ids, weights, top=32767)
    plain = registry.variants("moe_grouped")["reference"].fn(x, *banks, ids, weights)
    norm = plain.abs().mean()
    return (((got - rounded).abs().mean() / norm).item(),
            ((got - plain).abs().mean() / norm).item(), plain)
