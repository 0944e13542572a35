"""W4A8 against W4A16 (both cpu_c) at the SmolLM2 decode shapes, M = 1 and 8, group 32.

The two run interleaved, round after round, so a busy neighbour on a shared host slows
both alike; each cell is the best and the median over the rounds of the mean call time.
"cold" rotates through enough weight copies to fill --working-set-mib (every byte from
memory), "hot" repeats one copy (cache-resident at these shapes). The run is recorded as
bench/results/w4a8-DATE[-N].json (--no-record: printed only).

    .venv/bin/python bench/w4a8.py [--threads 2] [--rounds 7] [--working-set-mib 256]
"""
import argparse
import os
import pathlib
import statistics
import sys
import time

import torch

from engined import helper
from engined import ops  # noqa: F401  (registers every variant)
from engined.ops import int4_format, registry
from engined.ops.w4a16_gemv import cpu_c

SHAPES = [("q/o", 576, 576), ("k/v", 192, 576), ("gate/up", 1536, 576), ("down", 576, 1536)]
GROUP = 32
OPS = ("w4a16_gemv", "w4a8_gemv")


def packed(n: int, k: int) -> int4_format.PackedInt4:
    return int4_format.PackedInt4(
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
        (torch.rand(n, k // GROUP) * 0.02).half(), (torch.rand(n, k // GROUP) * -0.1).half(), GROUP)


def mean_call(fn, x, weights, min_time: float) -> float:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time:
        for w in weights:
            fn(x, w)
        calls += len(weights)
    return (time.perf_counter() - start) / calls


def measure(n, k, rows, weights, args) -> dict:
    x = torch.randn(rows, k)
    fns = {op: registry.variants(op)["cpu_c"].fn for op in OPS}
    times = {(op, kind): [] for op in OPS for kind in ("cold", "hot")}
    for fn in fns.values():  # warm up: pool threads, workspace, weight handles
        for w in weights:
            fn(x, w)
    for _ in range(args.rounds):
        for op, fn in fns.items():
            times[(op, "cold")].append(mean_call(fn, x, weights, args.min_time))
            times[(op, "hot")].append(mean_call(fn, x, weights[:1], args.min_time))
    return {key: (min(t) * 1e6, statistics.median(t) * 1e6) for key, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per cell per round")
    parser.add_argument("--working-set-mib", type=int, default=256)
    parser.add_argument("--no-record", action="store_true",
                        help="print only: no bench/results JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu_c.set_num_threads(args.threads)
    kernels = (f"w4a8 kernel {helper.INT8_LEVELS[helper.w4a8_simd()]}, "
               f"w4a16 kernel {helper.SIMD_LEVELS[helper.gemv_simd()]}")
    print(f"threads {args.threads}, {kernels}, load {os.getloadavg()[0]:.1f}")
    lines = ["| shape | N x K | M | w4a16 cold us (best/median) | w4a8 cold us | w4a16 hot us | "
             "w4a8 hot us | w4a8 speed-up cold / hot (medians) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(lines))
    rows = []
    for label, n, k in SHAPES:
        nbytes = n * k // 2 + n * (k // GROUP) * 4
        weights = [packed(n, k) for _ in range(max(2, (args.working_set_mib << 20) // nbytes))]
        for m in (1, 8):
            t = measure(n, k, m, weights, args)
            cells = [f"{t[(op, kind)][0]:.1f} / {t[(op, kind)][1]:.1f}"
                     for kind in ("cold", "hot") for op in OPS]
            gain = [t[("w4a16_gemv", kind)][1] / t[("w4a8_gemv", kind)][1]
                    for kind in ("cold", "hot")]
            lines.append(f"| {label} | {n}x{k} | {m} | {' | '.join(cells)} | "
                         f"{gain[0]:.2f}x / {gain[1]:.2f}x |")
            print(lines[-1], flush=True)
            rows.append({"shape": label, "n": n, "k": k, "m": m, **{
                f"{op}_{kind}_us": t[(op, kind)] for op in OPS for kind in ("cold", "hot")}})
        del weights
    if not args.no_record:
        record_run(args, kernels, lines, rows)


def record_run(args, kernels: str, lines: list[str], rows: list[dict]):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # common.py, beside this
    from common import record

    path = record("w4a8", {"threads": args.threads, "rounds": args.rounds, "rows": rows},
                  f"W4A8 against W4A16 GEMV, {args.threads} threads ({kernels})",
                  " ".join(["python bench/w4a8.py", *sys.argv[1:]]),
                  lines + ["", f"Microseconds per call, best / median of {args.rounds} "
                               f"interleaved rounds."])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
