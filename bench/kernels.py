"""GEMV benchmark: GB/s of every CPU variant of the INT4 ops at decode shapes (M = 1),
W4A8 (w4a8_gemv: x in int8, the same packed bytes) included,
beside two baselines measured in the same run:

- a read-bandwidth probe: the C helper's read_probe (the kernels' own threads, median of 7
  passes) over a buffer as large as the working set (torch sum on CUDA);
- torch fp32 matmul on the already dequantized weight (what a non-INT4 engine does).

"cold" rotates through enough copies of the weight to fill the working set (default
1 GiB, beyond the last-level cache of most machines), so every byte comes from memory;
"hot" repeats one copy (cache-resident for the small shapes). GB/s counts the packed
bytes a call must read: K/2 codes + 4*K/G scale and min bytes per output row.

    .venv/bin/python bench/kernels.py [--threads 2] [--working-set-mib 1024] [--no-record]
    python bench/kernels.py --device cuda      # the Triton variants, on a GPU machine

The host may be shared: each shape's rows sit next to a fresh probe and the 1-minute
load average, so a busy neighbour shows in the table instead of hiding in it.
"""
import argparse
import os
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import append_results, hardware, write_json  # noqa: E402

from engined import helper  # noqa: E402
from engined import ops  # noqa: E402,F401  (registers every variant)
from engined.ops import int4_format, registry  # noqa: E402
from engined.ops.w4a16_gemv import cpu_c  # noqa: E402
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts  # noqa: E402

GROUP = 32
DENSE = [("SmolLM2 q/o", 576, 576), ("SmolLM2 k/v", 192, 576), ("SmolLM2 gate/up", 1536, 576),
         ("SmolLM2 down", 576, 1536), ("Kimi KDA q/k/v", 4096, 2304), ("Kimi o_proj", 2304, 4096)]
ROUTED = [("Kimi experts w1/w3, 8 of E", 1024, 2304), ("Kimi experts w2, 8 of E", 2304, 1024)]
ROUTES = 8


def packed_bytes(n: int, k: int) -> int:
    return n * (k // 2) + n * (k // GROUP) * 4


DEVICE = "cpu"


def random_packed(n: int, k: int, lead=()) -> dict:
    return dict(qweight=torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, device=DEVICE),
                scales=(torch.rand(*lead, n, k // GROUP, device=DEVICE) * 0.02).half(),
                mins=(torch.rand(*lead, n, k // GROUP, device=DEVICE) * -0.1).half())


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def seconds_per_call(fn, args_list, min_time: float) -> float:
    """Best of 3 rounds; each round cycles the argument sets for at least min_time/3."""
    for args in args_list[:2]:
        fn(*args)
    best = float("inf")
    for _ in range(3):
        sync()
        calls, start = 0, time.perf_counter()
        while True:
            for args in args_list:
                fn(*args)
            calls += len(args_list)
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time / 3:
                break
        best = min(best, elapsed / calls)
    return best


PROBE_PASSES = 7


def probe_bandwidth(nbytes: int, min_time: float) -> float:
    """Read bandwidth, GB/s: the median of PROBE_PASSES passes over a buffer of `nbytes` (the
    working set, far beyond the last-level cache). On the CPU the C helper's read_probe reads
    it with the kernels' own pool threads (AVX2 loads, eight accumulators: neither the adds
    nor one thread's latency limit it); on CUDA a torch sum."""
    if DEVICE == "cuda":
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=DEVICE)
        return nbytes / seconds_per_call(lambda: buf.sum(), [()], min_time) / 1e9
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


def bench_dense(label, n, k, args) -> list[dict]:
    # next to its rows: the load on a shared host drifts
    probe = probe_bandwidth(args.working_set, args.min_time)
    copies = copies_for(packed_bytes(n, k), args.working_set)
    weights = [int4_format.PackedInt4(group_size=GROUP, **random_packed(n, k)) for _ in range(copies)]
    x = torch.randn(1, k, device=DEVICE)
    rows = []
    for op in ("w4a16_gemv", "w4a8_gemv"):  # W4A8: x rounded to int8 per 32-block first
        for name, variant in sorted(registry.variants(op).items()):
            if DEVICE not in variant.devices or (name == registry.REFERENCE and not args.reference):
                continue
            cold = seconds_per_call(variant.fn, [(x, w) for w in weights], args.min_time)
            hot = seconds_per_call(variant.fn, [(x, weights[0])], args.min_time)
            shown = name if op == "w4a16_gemv" else f"w4a8 {name}"
            rows.append(row(label, op, shown, n, k, packed_bytes(n, k), cold, hot, probe))
    dense = [int4_format.dequantize(w) for w in weights[:copies_for(4 * n * k, args.working_set)]]
    del weights  # keep one working set in memory at a time
    cold = seconds_per_call(lambda a, b: a @ b.t(), [(x, w) for w in dense], args.min_time)
    hot = seconds_per_call(lambda a, b: a @ b.t(), [(x, dense[0])], args.min_time)
    rows.append(row(label, "w4a16_gemv", "torch fp32 matmul", n, k, 4 * n * k, cold, hot, probe))
    return rows


def bench_routed(label, n, k, args) -> list[dict]:
    probe = probe_bandwidth(args.working_set, args.min_time)
    experts = max(ROUTES, copies_for(packed_bytes(n, k), args.working_set))
    stack = PackedInt4Experts(group_size=GROUP, **random_packed(n, k, lead=(experts,)))
    gen = torch.Generator().manual_seed(0)
    picks = [(torch.randn(1, k, device=DEVICE), stack,
              torch.randperm(experts, generator=gen)[:ROUTES].to(DEVICE)) for _ in range(16)]
    rows = []
    for name, variant in sorted(registry.variants("w4a16_grouped_gemv").items()):
        if DEVICE not in variant.devices or name == registry.REFERENCE:
            continue
        cold = seconds_per_call(variant.fn, picks, args.min_time)
        hot = seconds_per_call(variant.fn, picks[:1], args.min_time)
        rows.append(row(f"{label}={experts}", "w4a16_grouped_gemv", name, n, k,
                        ROUTES * packed_bytes(n, k), cold, hot, probe))
    return rows


MOE_EXPERTS, MOE_TOP_K, MOE_D, MOE_I = 256, 8, 2304, 1024


def bench_moe_layer(args) -> list[dict]:
    """One Kimi-Linear MoE layer's routed experts at real shapes (256 experts of w1/w3 [1024,
    2304] and w2 [2304, 1024], symmetric INT4, top-8) through moe_grouped and its W4A8 form
    moe_grouped_w4a8: B = 1 (8 experts,
    ~32 MB read, random picks per call so nothing stays cached) and a 256-token prefill
    chunk (every expert read once for all the rows that chose it). GB/s counts the bytes of
    the experts the call chose; tok/s is tokens per second through this one layer."""
    probe = probe_bandwidth(args.working_set, args.min_time)
    gen = torch.Generator().manual_seed(3)
    symmetric = lambda n, k: {**random_packed(n, k, lead=(MOE_EXPERTS,)), "mins": None}  # noqa: E731
    banks = [PackedInt4Experts(group_size=GROUP, **symmetric(n, k))
             for n, k in ((MOE_I, MOE_D), (MOE_I, MOE_D), (MOE_D, MOE_I))]
    expert_bytes = 3 * MOE_I * MOE_D * 9 // 16            # codes + one fp16 scale per 32
    rows = []
    for tokens in (1, 256):
        calls = []
        for _ in range(8):
            picks = torch.stack([torch.randperm(MOE_EXPERTS, generator=gen)[:MOE_TOP_K]
                                 for _ in range(tokens)]).to(DEVICE)
            calls.append((torch.randn(tokens, MOE_D, device=DEVICE), *banks, picks,
                          torch.rand(tokens, MOE_TOP_K, device=DEVICE)))
        chosen = statistics.mean(len(torch.unique(c[4])) for c in calls) * expert_bytes
        for op in ("moe_grouped", "moe_grouped_w4a8"):  # W4A8: x and h rounded to int8 first
            for name, variant in sorted(registry.variants(op).items()):
                if DEVICE not in variant.devices or name == registry.REFERENCE:
                    continue
                secs = seconds_per_call(variant.fn, calls, args.min_time)
                shown = name if op == "moe_grouped" else f"w4a8 {name}"
                r = row(f"Kimi MoE layer, T={tokens}, top-8 of 256", op, shown, MOE_D,
                        MOE_I, int(chosen), secs, secs, probe)
                r["tok_s"] = tokens / secs
                rows.append(r)
    return rows


def row(label, op, variant, n, k, nbytes, cold, hot, probe) -> dict:
    gbs = nbytes / cold / 1e9
    return dict(shape=label, op=op, variant=variant, n=n, k=k, bytes=nbytes, us_cold=cold * 1e6,
                us_hot=hot * 1e6, gbs_cold=gbs, gbs_hot=nbytes / hot / 1e9, probe_gbs=probe,
                pct_of_probe=100 * gbs / probe, loadavg_1min=os.getloadavg()[0])


def table(rows: list[dict]) -> list[str]:
    lines = ["| shape | N x K | variant | us cold | GB/s cold | probe GB/s | % of probe | us hot |"
             " GB/s hot | vs torch fp32 | load |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {r["shape"]: r["us_cold"] for r in rows if r["variant"] == "torch fp32 matmul"}
    for r in rows:
        ratio = f"{base[r['shape']] / r['us_cold']:.2f}x" if r["shape"] in base else "-"
        lines.append(f"| {r['shape']} | {r['n']}x{r['k']} | {r['variant']} | {r['us_cold']:.1f} | "
                     f"{r['gbs_cold']:.1f} | {r['probe_gbs']:.1f} | {r['pct_of_probe']:.0f}% | "
                     f"{r['us_hot']:.1f} | {r['gbs_hot']:.1f} | {ratio} | {r['loadavg_1min']:.1f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--working-set-mib", type=int, default=1024)
    parser.add_argument("--min-time", type=float, default=0.6, help="seconds per measurement")
    parser.add_argument("--reference", action="store_true", help="also time the slow reference")
    parser.add_argument("--no-record", action="store_true", help="print only; write no results")
    args = parser.parse_args()
    args.working_set = args.working_set_mib << 20
    global DEVICE
    DEVICE = args.device
    torch.set_num_threads(args.threads)
    cpu_c.set_num_threads(args.threads)
    rows = [r for label, n, k in DENSE for r in bench_dense(label, n, k, args)]
    rows += [r for label, n, k in ROUTED for r in bench_routed(label, n, k, args)]
    rows += bench_moe_layer(args)
    lines = table(rows)
    print("\n".join(lines))
    if args.no_record:
        return
    command = "python bench/kernels.py " + " ".join(sys.argv[1:])
    where = hardware() if DEVICE == "cpu" else torch.cuda.get_device_name()
    path = write_json(f"gemv-{DEVICE}", dict(hardware=where, command=command, device=DEVICE,
                                              threads=args.threads,
                                              rows=rows))
    notes = ["", f"Probe: the C helper's read_probe over {args.working_set_mib} MiB (median of "
             f"{PROBE_PASSES} passes) before each shape (torch sum on CUDA); load: 1-minute load "
             f"average (other jobs share this host). MoE layer rows: tok/s through one layer = "
             + ", ".join(f"{r['tok_s']:.0f} (T={r['shape'].split('T=')[1].split(',')[0]})"
                         for r in rows if "tok_s" in r) + "."]
    if DEVICE == "cpu":
        notes.append("GPU: not run (no GPU in this session); on a GPU machine: "
                     "`python bench/kernels.py --device cuda`.")
    append_results(f"INT4 GEMV on {DEVICE} ({where}), M=1, {args.threads} threads", command.strip(),
                   lines + notes)
    print(f"wrote {path} and a block in bench/RESULTS.md")


if __name__ == "__main__":
    main()
