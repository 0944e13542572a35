"""INT4 prefill GEMM benchmark: one prefill chunk (T rows) through every INT4 projection shape
of SmolLM2 (the default model) and Kimi-Linear, three ways, timed in the same run:

- old: what Linear did before w4a16_gemm: dequantize W to fp32 (the C helper's unpack), then
  torch's F.linear (MKL sgemm); it holds N*K*4 bytes per call;
- passes: the decode GEMV (w4a16_gemv cpu_c) in passes of 8 rows, each decoding all of W;
- gemm: w4a16_gemm cpu_c, W decoded tile by tile into L1 (csrc/kimi_gemm.c);
- w4a8: the W4A8 decode GEMV (w4a8_gemv cpu_c, x rounded to int8 per 32, integer dots) in
  passes of 8 rows: issue 16 asks for W4A8 prefill wherever it measures faster than gemm.

The four run interleaved, best of --rounds each (the host may be shared: the 1-minute load
average is printed with every row); GFLOP/s counts 2*T*N*K.

    .venv/bin/python bench/prefill_gemm.py [--tokens 256] [--threads 2] [--no-record]
"""
import argparse
import os
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import record  # noqa: E402

from engined import helper  # noqa: E402
from engined.layers.linear import Linear  # noqa: E402
from engined.ops.int4_format import PackedInt4  # noqa: E402
from engined.ops.w4a16_gemm import cpu_c as gemm_cpu_c  # noqa: E402
from engined.ops.w4a16_gemv import cpu_c  # noqa: E402
from engined.ops.w4a8_gemv import cpu_c as w4a8_cpu_c  # noqa: E402

GROUP = 32
SHAPES = [("SmolLM2 q/k/v stacked", 960, 576), ("SmolLM2 o", 576, 576),
          ("SmolLM2 gate/up stacked", 3072, 576), ("SmolLM2 down", 576, 1536),
          ("Kimi KDA q/k/v", 4096, 2304), ("Kimi o_proj", 2304, 4096),
          ("Kimi 2304x2304", 2304, 2304), ("Kimi dense gate/up", 9216, 2304)]
METHODS = ("old", "passes", "gemm", "w4a8")


def symmetric_weight(n: int, k: int) -> PackedInt4:
    g = torch.Generator().manual_seed(n * 7 + k)
    return PackedInt4(torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8),
                      (torch.rand(n, k // GROUP, generator=g) * 0.02).half(), None, GROUP)


def bench_shape(label: str, n: int, k: int, args) -> dict:
    w = symmetric_weight(n, k)
    lin, x = Linear.from_packed(w), torch.randn(args.tokens, k)
    calls = {"old": lambda: F.linear(x, lin.dense_weight(torch.float32)),
             "passes": lambda: cpu_c.w4a16_gemv(x, w),
             "gemm": lambda: gemm_cpu_c.w4a16_gemm(x, w),
             "w4a8": lambda: w4a8_cpu_c.w4a8_gemv(x, w)}
    best = {m: float("inf") for m in METHODS}
    for m in METHODS:
        calls[m]()  # warm: weight handles, pages
    for _ in range(args.rounds):
        for m in METHODS:
            start = time.perf_counter()
            calls[m]()
            best[m] = min(best[m], time.perf_counter() - start)
    flop = 2 * args.tokens * n * k
    return dict(shape=label, n=n, k=k, tokens=args.tokens, loadavg_1min=os.getloadavg()[0],
                **{f"ms_{m}": best[m] * 1e3 for m in METHODS},
                **{f"gflops_{m}": flop / best[m] / 1e9 for m in METHODS})


def table(rows: list[dict]) -> list[str]:
    lines = ["| shape | N x K | old ms (GFLOP/s) | passes ms (GFLOP/s) | gemm ms (GFLOP/s) | "
             "w4a8 passes ms (GFLOP/s) | gemm / old | w4a8 / gemm | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{r[f'ms_{m}']:.2f} ({r[f'gflops_{m}']:.0f})" for m in METHODS)
        lines.append(f"| {r['shape']} | {r['n']} x {r['k']} | {cells} | "
                     f"{r['ms_gemm'] / r['ms_old']:.2f} | {r['ms_w4a8'] / r['ms_gemm']:.2f} | "
                     f"{r['loadavg_1min']:.1f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="rows of x (a prefill chunk)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help="print only; write no results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu_c.set_num_threads(args.threads)
    level = helper.SIMD_LEVELS[helper.gemv_simd()]
    rows = [bench_shape(label, n, k, args) for label, n, k in SHAPES]
    lines = table(rows)
    print(f"T={args.tokens}, {args.threads} threads, kernels: {level}")
    print("\n".join(lines))
    if args.no_record:
        return
    command = "python bench/prefill_gemm.py " + " ".join(sys.argv[1:])
    path = record("prefill_gemm", dict(command=command, simd=level, threads=args.threads, rows=rows),
                  f"INT4 prefill GEMM, T={args.tokens}, {args.threads} threads ({level})",
                  command, lines)
    print(f"wrote {path} and bench/RESULTS.md")


if __name__ == "__main__":
    main()
