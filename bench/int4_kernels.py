"""GEMV benchmark: GB/s of every variant of the INT4 ops on the device at decode shapes
(M = 1), both INT4 schemes (asym: scales and mins; sym: scales only), W4A8 (w4a8_gemv: x in
int8, the same packed bytes) included, beside two baselines measured in the same run:

- the memory ceiling: on the CPU the C helper's read_probe (the kernels' own threads, median
  of 7 passes) over a buffer as large as the working set; on CUDA the device's copy
  bandwidth (a working-set-sized tensor copy timed by CUDA events, read + write counted);
- torch matmul on the already dequantized weight (what a non-INT4 engine does: fp32 on the
  CPU, bf16 on CUDA).

"cold" rotates through enough copies of the weight to fill the working set (default
1 GiB, beyond the last-level cache, the 50 MB L2 of an H200 included), so every byte comes
from memory; "hot" repeats one copy (cache-resident for the small shapes). GB/s counts the
packed bytes a call must read: K/2 codes + 4*K/G (sym: 2*K/G) scale and min bytes per row.
On CUDA the calls of a measurement are recorded in one CUDA graph and replayed, timed by
CUDA events (no launch or Python overhead, as the engine's decode step runs them), at the
Kimi-Linear shapes; every variant registered for the device is measured, a new one included.

    .venv/bin/python bench/int4_kernels.py [--threads 2] [--working-set-mib 1024] [--no-record]
    python bench/int4_kernels.py --device cuda      # the Triton variants, on a GPU machine

The host may be shared: on the CPU each shape's rows sit next to a fresh probe and the
1-minute load average, so a busy neighbour shows in the table instead of hiding in it.
"""
import argparse
import dataclasses
import functools
import os
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import copy_bandwidth, hardware, record  # noqa: E402
from int4_moe import bench_moe_decode, bench_moe_layer, expert_banks  # noqa: E402

from engined import helper  # noqa: E402
from engined import ops  # noqa: E402,F401  (registers every variant)
from engined.ops import int4_format, registry  # noqa: E402
from engined.ops.w4a16_gemv import cpu_c  # noqa: E402
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts  # noqa: E402
from engined.weights import kimi_checkpoint  # noqa: E402

GROUP = 32
DENSE = [("SmolLM2 q/o", 576, 576), ("SmolLM2 k/v", 192, 576), ("SmolLM2 gate/up", 1536, 576),
         ("SmolLM2 down", 576, 1536), ("Kimi KDA q/k/v", 4096, 2304), ("Kimi o_proj", 2304, 4096),
         ("Kimi shared expert w1/w3", 1024, 2304), ("Kimi shared expert w2", 2304, 1024)]
# on CUDA the step's one launch for KDA's q, k and v (Linear.stacked); the CPU's tables keep
# their rows comparable with earlier records
DENSE_CUDA = [("Kimi KDA q/k/v stacked", 12288, 2304)]
ROUTED = [("Kimi experts w1/w3, 8 of E", 1024, 2304), ("Kimi experts w2, 8 of E", 2304, 1024)]
ROUTES = 8
SCHEMES = (("asym", False), ("sym", True))
BASELINE = {"cpu": "torch fp32 matmul", "cuda": "torch bf16 matmul"}
DEVICE = "cpu"
GRAPH_CALLS = 64        # calls per CUDA graph at least: one replay is long enough to time
LOOP_TIMED: list[str] = []  # CUDA measurements whose capture failed (timed by a call loop)


def packed_bytes(n: int, k: int, symmetric: bool = False) -> int:
    return n * (k // 2) + n * (k // GROUP) * (2 if symmetric else 4)


def random_packed(n: int, k: int, lead=(), symmetric: bool = False) -> dict:
    """Random codes and scales on DEVICE. Off the CPU the codes are flagged in the GPU
    kernels' order, the loop the engine serves there (KimiLinearModel.settle_on_device_
    reorders every bank on CUDA): random codes reordered are as random, so the flag alone
    picks the kernels' loop."""
    groups = (*lead, n, k // GROUP)
    # random bytes drawn 4 at a time: a MoE layer's 256 experts are 0.9 GB of codes, and
    # torch draws uint8 one by one (18 s of the dry run on a 2-core EPYC)
    codes = torch.randint(-2**31, 2**31 - 1, (*lead, n, k // 8), dtype=torch.int32, device=DEVICE)
    return dict(qweight=codes.view(torch.uint8),
                scales=(torch.rand(groups, device=DEVICE) * 0.02).half(),
                mins=None if symmetric else (torch.rand(groups, device=DEVICE) * -0.1).half(),
                gpu_order=DEVICE != "cpu")


def seconds_per_call(fn, args_list, min_time: float, what: str = "") -> float:
    if DEVICE == "cuda":
        try:
            return graph_seconds_per_call(fn, args_list)
        except RuntimeError as exc:  # a launcher that syncs cannot be captured: say so, time it
            LOOP_TIMED.append(f"{what}: {str(exc).splitlines()[0]}")
    return loop_seconds_per_call(fn, args_list, min_time)


def loop_seconds_per_call(fn, args_list, min_time: float) -> float:
    """Best of 3 rounds; each round calls with the argument sets in turn (on from where the
    last round stopped) until min_time/3 has passed. A round ends on the call that passes it,
    not at the end of the sets: a 256-token MoE call takes 0.3-0.5 s on a 2-core CPU, so 8
    sets a round made --min-time 0.02 (the dry run's) take 90 s on an AVX2-only EPYC."""
    fn(*args_list[0])
    best, turn = float("inf"), 1
    for _ in range(3):
        sync()
        calls, start = 0, time.perf_counter()
        while True:
            fn(*args_list[turn % len(args_list)])
            calls, turn = calls + 1, turn + 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time / 3:
                break
        best = min(best, elapsed / calls)
    return best


def graph_seconds_per_call(fn, args_list) -> float:
    """Device seconds per call: the argument sets in turn (GRAPH_CALLS calls at least)
    recorded in one CUDA graph, replayed, timed by CUDA events; the median of 5 replays."""
    for args in args_list[:2]:
        fn(*args)                             # compiles and picks configs outside the capture
    torch.cuda.synchronize()
    calls = [args_list[i % len(args_list)] for i in range(max(GRAPH_CALLS, len(args_list)))]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in calls:
            fn(*args)
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(calls))
    return statistics.median(times)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


PROBE_PASSES = 7


@functools.cache
def device_copy_gbs(nbytes: int) -> float:
    return copy_bandwidth("cuda", nbytes >> 20) / 1e9


def probe_bandwidth(nbytes: int, min_time: float) -> float:
    """The memory ceiling, GB/s, over a buffer of `nbytes` (the working set, far beyond the
    last-level cache). On the CPU the C helper's read_probe reads it with the kernels' own pool
    threads (AVX2 loads, eight accumulators: neither the adds nor one thread's latency limit
    it), the median of PROBE_PASSES passes; on CUDA a tensor copy, read + write counted, once."""
    if DEVICE == "cuda":
        return device_copy_gbs(nbytes)
    buf = torch.ones(nbytes // 8, dtype=torch.int64)
    threads = cpu_c.num_threads()
    helper.read_probe(buf, threads)                       # touch every page first
    times = []
    for _ in range(PROBE_PASSES):
        start = time.perf_counter()
        helper.read_probe(buf, threads)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def copies_for(nbytes: int, working_set: int) -> int:
    return max(2, -(-working_set // nbytes))


def measured_variants(op: str, args) -> list[tuple[str, object]]:
    """Every variant of `op` registered for this device (the reference only with --reference)."""
    return [(name, v) for name, v in sorted(registry.variants(op).items())
            if DEVICE in v.devices and (name != registry.REFERENCE or args.reference)]


def bench_dense(label, n, k, args) -> list[dict]:
    # next to its rows: the load on a shared host drifts
    probe = probe_bandwidth(args.working_set, args.min_time)
    rows = []
    for scheme, symmetric in SCHEMES:
        nbytes = packed_bytes(n, k, symmetric)
        weights = [int4_format.PackedInt4(group_size=GROUP,
                                          **random_packed(n, k, symmetric=symmetric))
                   for _ in range(copies_for(nbytes, args.working_set))]
        x = torch.randn(1, k, device=DEVICE).to(kimi_checkpoint.act_dtype(DEVICE))  # bf16 on CUDA
        # W4A8: x rounded to int8 per 32-block first; then the CPU's tiles (in place), where
        # the Llama family runs w4a8_tiles and Kimi-Linear w4a16_tiles (x rounded to int16)
        tile_ops = ("w4a16_tiles", "w4a8_tiles") if DEVICE == "cpu" and n % 16 == 0 else ()
        for op in ("w4a16_gemv", "w4a8_gemv", *tile_ops):
            if op == "w4a16_tiles":                 # the first tile op: W into tiles, in place
                for w in weights:
                    int4_format.tile_in_place_(w)
                weights = [dataclasses.replace(w, tiles=True) for w in weights]
            for name, variant in measured_variants(op, args):
                if name == registry.REFERENCE and op in tile_ops:
                    continue
                shown = {"w4a16_gemv": name, "w4a8_gemv": f"w4a8 {name}",
                         "w4a16_tiles": f"tiles {name}", "w4a8_tiles": f"w4a8 tiles {name}"}[op]
                what = f"{label} {shown} {scheme}"
                cold = seconds_per_call(variant.fn, [(x, w) for w in weights], args.min_time, what)
                hot = seconds_per_call(variant.fn, [(x, weights[0])], args.min_time, what)
                rows.append(row(label, op, shown, scheme, n, k, nbytes, cold, hot, probe))
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    size = dtype.itemsize * n * k
    dense = [int4_format.dequantize(weights[0]).to(dtype)
             for _ in range(copies_for(size, args.working_set))]
    del weights  # keep one working set in memory at a time
    x = x.to(dtype)
    matmul = lambda a, b: a @ b.t()  # noqa: E731
    cold = seconds_per_call(matmul, [(x, w) for w in dense], args.min_time, f"{label} matmul")
    hot = seconds_per_call(matmul, [(x, dense[0])], args.min_time, f"{label} matmul")
    rows.append(row(label, "w4a16_gemv", BASELINE[DEVICE], "-", n, k, size, cold, hot, probe))
    return rows


def bench_routed(label, n, k, args) -> list[dict]:
    probe = probe_bandwidth(args.working_set, args.min_time)
    rows = []
    for scheme, symmetric in SCHEMES:
        experts = max(ROUTES, copies_for(packed_bytes(n, k, symmetric), args.working_set))
        stack = PackedInt4Experts(group_size=GROUP,
                                  **random_packed(n, k, lead=(experts,), symmetric=symmetric))
        gen = torch.Generator().manual_seed(0)
        picks = [(torch.randn(1, k, device=DEVICE).to(kimi_checkpoint.act_dtype(DEVICE)), stack,
                  torch.randperm(experts, generator=gen)[:ROUTES].to(DEVICE)) for _ in range(16)]
        for name, variant in measured_variants("w4a16_grouped_gemv", args):
            if name == registry.REFERENCE:
                continue
            what = f"{label} {name} {scheme}"
            cold = seconds_per_call(variant.fn, picks, args.min_time, what)
            hot = seconds_per_call(variant.fn, picks[:1], args.min_time, what)
            rows.append(row(f"{label}={experts}", "w4a16_grouped_gemv", name, scheme, n, k,
                            ROUTES * packed_bytes(n, k, symmetric), cold, hot, probe))
        del stack, picks
    return rows


def row(label, op, variant, scheme, n, k, nbytes, cold, hot, probe) -> dict:
    gbs = nbytes / cold / 1e9
    return dict(shape=label, op=op, variant=variant, scheme=scheme, n=n, k=k, bytes=nbytes,
                us_cold=cold * 1e6, us_hot=hot * 1e6, gbs_cold=gbs, gbs_hot=nbytes / hot / 1e9,
                probe_gbs=probe, pct_of_probe=100 * gbs / probe, loadavg_1min=os.getloadavg()[0])


def table(rows: list[dict]) -> list[str]:
    lines = ["| shape | N x K | variant | INT4 | us cold | GB/s cold | probe GB/s | % of probe |"
             " us hot | GB/s hot | vs torch matmul | load |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {r["shape"]: r["us_cold"] for r in rows if r["variant"] == BASELINE[DEVICE]}
    for r in rows:
        ratio = f"{base[r['shape']] / r['us_cold']:.2f}x" if r["shape"] in base else "-"
        lines.append(f"| {r['shape']} | {r['n']}x{r['k']} | {r['variant']} | {r['scheme']} | "
                     f"{r['us_cold']:.1f} | {r['gbs_cold']:.1f} | {r['probe_gbs']:.1f} | "
                     f"{r['pct_of_probe']:.0f}% | {r['us_hot']:.1f} | {r['gbs_hot']:.1f} | "
                     f"{ratio} | {r['loadavg_1min']:.1f} |")
    return lines


def measurements(args):
    """-> one group of rows per shape, as measured. On CUDA only the Kimi-Linear shapes."""
    dense = [shape for shape in DENSE if DEVICE == "cpu" or shape[0].startswith("Kimi")]
    dense += DENSE_CUDA if DEVICE == "cuda" else []
    for label, n, k in dense:
        yield bench_dense(label, n, k, args)
    for label, n, k in ROUTED:
        yield bench_routed(label, n, k, args)
    this = sys.modules[__name__]  # int4_moe reads DEVICE and the helpers from the running module
    banks = expert_banks(this)
    yield bench_moe_layer(this, args, banks)
    yield bench_moe_decode(this, args, banks)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--working-set-mib", type=int, default=1024)
    parser.add_argument("--min-time", type=float, default=0.6,
                        help="seconds per measurement on the CPU (CUDA: one graph replay)")
    parser.add_argument("--reference", action="store_true", help="also time the slow reference")
    parser.add_argument("--no-record", action="store_true", help="print only; write no results")
    parser.add_argument("--avx2", action="store_true",
                        help="CPU: cap the C kernels at AVX2 (what an AVX2-only machine runs), "
                             "recorded as its own benchmark, gemv-cpu-avx2")
    parser.add_argument("--kind", metavar="NAME",
                        help="record as its own benchmark, gemv-DEVICE[-avx2]-NAME, beside the "
                             "newest run of another machine kind (e.g. --kind xeon-amx)")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the record's notes (an A/B beside it, ...); repeatable")
    args = parser.parse_args()
    args.working_set = args.working_set_mib << 20
    global DEVICE
    DEVICE = args.device
    torch.set_num_threads(args.threads)
    cpu_c.set_num_threads(args.threads)
    if args.avx2:
        helper.gemv_simd(1)          # caps the integer-dot kernels too
    lines, rows = table([]), []
    print("\n".join(lines))
    for group in measurements(args):  # each shape's rows printed as soon as measured
        rows += group
        lines += table(group)[2:]
        print("\n".join(table(group)[2:]))
    if LOOP_TIMED:
        print("timed by a call loop, not a CUDA graph (its capture failed):\n  "
              + "\n  ".join(LOOP_TIMED))
    if args.no_record:
        return
    command = "python bench/int4_kernels.py " + " ".join(sys.argv[1:])
    where = hardware() if DEVICE == "cpu" else torch.cuda.get_device_name()
    probe = (f"the C helper's read_probe over {args.working_set_mib} MiB (median of {PROBE_PASSES}"
             f" passes) before each shape" if DEVICE == "cpu" else
             f"the device's copy bandwidth ({args.working_set_mib} MiB copied, read + write "
             f"counted); every call timed inside a CUDA graph")
    notes = ["", f"Probe: {probe}; load: 1-minute load average (other jobs share this host). "
             f"MoE layer rows: tok/s through one layer = "
             + ", ".join(f"{r['tok_s']:.0f} (T={r['shape'].split('T=')[1].split(',')[0]})"
                         for r in rows if "tok_s" in r) + "."]
    notes += args.note
    if DEVICE == "cpu":
        notes.append("GPU: not run (no GPU in this session); on a GPU machine: "
                     "`python bench/int4_kernels.py --device cuda`.")
    capped = " (kernels capped at AVX2)" if args.avx2 else ""
    name = f"gemv-{DEVICE}" + ("-avx2" if args.avx2 else "") + (f"-{args.kind}" if args.kind else "")
    path = record(name,
                  dict(hardware=where, command=command, device=DEVICE, threads=args.threads,
                       loop_timed=LOOP_TIMED, rows=rows),
                  f"INT4 GEMV on {DEVICE} ({where}){capped}, M=1, {args.threads} threads", command,
                  lines + notes)
    print(f"wrote {path} and bench/RESULTS.md")


if __name__ == "__main__":
    main()
