"""Hybrid MoE serving (issue 30): a synthetic Kimi-Linear served with routed experts in RAM,
with and without the VRAM expert cache, beside the RAM-bandwidth cap of the CPU part.

    python bench/offload.py --route-trace bench/data/route-trace-claude-tool.json.gz \\
        --decode-only gpu-memory=24GiB+moe-cache=0,cpu-moe+moe-cache=0 --out DIR  # gpu_run.sh

A placement is serve flags: NAME[=VALUE] is --NAME [VALUE], + joins flags; X+moe-cache=0 is X
without the expert cache, judged against X (the cache at its planned default). Each starts
`python -m engined serve` (own process group, log DIR/offload-NAME-engine.log, stopped with it:
bench/served.py) and measures through the socket with bench/serve_streams.py's functions: greedy
decode tok/s at --streams; unless --decode-only names it, a --prefill-token prompt's TTFT (after
a 256-token warm-up); peak device memory and its source (nvidia-smi's row of the engine,
CUDA context included; VmHWM on the CPU); the placement and expert cache it logged; the offload
and cache counters (the hybrid path ran; the cache's hit rate). The synthetic routers are
random, so no expert is hot: --route-trace FILE sets KIMI_ROUTE_TRACE=FILE for every engine,
and the experts of its MoE layers in RAM follow a trace of a real agent turn on the tiny
checkpoint (bench/route_trace.py), spread to the model's shapes (engined/layers/route_trace.py);
an engine that does not log so fails its placement.

RAM-bandwidth cap = host read bandwidth (the C helper's read_probe on --threads threads over
--probe-mib, median of 7, before any engine) / the routed-expert bytes the CPU reads per decoded
token (per MoE layer in RAM, top_k/E of its INT4 w1/w3/w2 banks, from the model planned on the
meta device; no cache hits). Goals (issue 30, the GPU machine's 16 cores): --cpu-moe decode >=
60% of its cap; --gpu-memory 24GiB decode >= 2.5x --cpu-moe's, its peak <= 24 GiB; with the
cache >= 1.25x without. DIR/offload.json is written after each phase (a section killed at its
limit keeps what it measured). Without the C helper this exits 2 at once, saying how to carry it.
"""
import argparse
import json
import os
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import hardware, record_line  # noqa: E402
from prefill_requests import prefill_ttft  # noqa: E402
from serve_streams import (GRAPH_FAILURES, NOT_EXPOSED, decode_rates, decode_steps,  # noqa: E402
                           prompt_tokens, sizes, stream_prompts)
from served import Engine, GpuMemorySampler, on_sigterm, peak_memory  # noqa: E402

PLACEMENT_RE = re.compile(r"kimi-engine: (placement on .*|  routed experts of (\d+) of (\d+) "
                          r"MoE layers in RAM.*|  expert cache: .*|.* (follow the route trace) .*)$")
OFFLOAD_CALLS = "kimi_engine_offload_moe_calls_total"
OFFLOAD_BYTES = 'kimi_engine_offload_bytes_total{direction="%s"}'
CACHE_LOOKUPS = "kimi_engine_moe_cache_lookups_total{"
CARRY_HINT = (
    "On the GPU image (python 3.12, torch, no cffi or numpy, no network) carry it: run "
    "`make gpu-carry` where the repository is built (it fetches the cp312 cffi and numpy "
    "wheels into .gpu-carry/wheels), then run `bash bench/gpu_run.sh offload` with carry "
    '["engined/_kimi_helper.abi3.so", ".gpu-carry/wheels"]: gpu_run.sh unpacks the wheels for '
    "that python and puts them on PYTHONPATH. Elsewhere: `make setup` builds the helper.")


def placements(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """'gpu-memory=24GiB,cpu-moe' -> [('gpu-memory=24GiB', ('--gpu-memory', '24GiB')),
    ('cpu-moe', ('--cpu-moe',))]; '+' joins flags of one placement:
    'gpu-memory=24GiB+moe-cache=0' -> ('--gpu-memory', '24GiB', '--moe-cache', '0')."""
    rows = []
    for item in text.split(","):
        flags = []
        for part in item.split("+"):
            name, _, value = part.partition("=")
            flags += [f"--{name}", value] if value else [f"--{name}"]
        rows.append((item, tuple(flags)))
    return rows


def helper_missing() -> str | None:
    """Why the hybrid path cannot run here, or None when the C helper imported."""
    from engined import helper

    try:
        helper.require()
    except helper.HelperError as exc:
        return (f"bench/offload.py: {exc}. The hybrid MoE path computes the routed experts in "
                f"RAM on the CPU threads through the C helper (engined/_kimi_helper.abi3.so, "
                f"an abi3 cffi module that needs cffi's _cffi_backend and numpy). {CARRY_HINT}")
    return None


def ram_read_bandwidth(threads: int, mib: int) -> float:
    """Host read bandwidth, bytes/s: bench/int4_kernels.py's probe on `threads` pool threads."""
    import int4_kernels
    from engined.ops.w4a16_gemv import cpu_c

    cpu_c.set_num_threads(threads)
    return int4_kernels.probe_bandwidth(mib << 20, 0) * 1e9


def routed_bytes_per_token(spec: str) -> list[int]:
    """Per MoE layer, in layer order: the routed-expert bytes one decoded token reads (top_k
    of E experts' w1/w3/w2, codes and scales), from the model planned on the meta device."""
    from engined.weights import synthetic
    from engined.weights.placement import model_parts

    model = synthetic.build(synthetic.config_of(spec), "meta", fill=False)
    c = model.config
    return [nbytes * c.num_experts_per_token // c.num_experts
            for _, nbytes in model_parts(model).routed]


def placement_of(log: str) -> dict:
    """The engine log's placement table -> its header, the RAM and cache lines, the counts;
    is_following: whether the layers in RAM follow a route trace."""
    found = {"lines": [], "is_following": False}
    for line in log.splitlines():
        match = PLACEMENT_RE.search(line)
        if match:
            found["lines"].append(match.group(1).strip())
            if match.group(2):
                found["layers_in_ram"], found["moe_layers"] = int(match[2]), int(match[3])
            found["is_following"] |= bool(match.group(4))
    return found


def offload_counts(metrics: dict[str, float]) -> dict:
    return {"moe_calls": metrics.get(OFFLOAD_CALLS, 0),
            "bytes_to_host": metrics.get(OFFLOAD_BYTES % "to_host", 0),
            "bytes_to_device": metrics.get(OFFLOAD_BYTES % "to_device", 0),
            "decode_steps": decode_steps(metrics),
            "graph_capture_failures": metrics.get(GRAPH_FAILURES, NOT_EXPOSED),
            **{key: sum(v for k, v in metrics.items() if k.startswith(CACHE_LOOKUPS)
                        and f'result="{result}"' in k)
               for key, result in (("cache_hits", "hit"), ("cache_misses", "miss"))}}


def measure_placement(args, name: str, flags: tuple[str, ...], row: dict, save):
    """One engine with `flags`: decode, prefill, placement, offload counters and peak memory
    into `row`, saved after each phase."""
    log = args.out / f"offload-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-engine.log"
    engine = Engine(args.model, args.device, args.max_context, max(args.streams), args.threads,
                    args.start_timeout, flags, log)
    sampler = GpuMemorySampler.start_for(engine) if args.device == "cuda" else None
    try:
        place = row["placement"] = placement_of(engine.log.read_text(errors="replace"))
        if args.route_trace and place.get("layers_in_ram") and not place["is_following"]:
            raise RuntimeError(f"the engine logged no MoE layers following {args.route_trace}")
        row["decode_prompt_tokens"] = prompt_tokens(engine, stream_prompts(1)[0])
        row["decode_tok_s"], row["prefill"] = {}, {}
        for n, rate in decode_rates(engine, args):
            row["decode_tok_s"][n] = rate
            save()
        if name not in args.decode_only:
            prefill_ttft(engine, 256, seed=0)  # warm-up: the prefill path at one chunk
        for size in () if name in args.decode_only else args.prefill:
            ttft, counted = prefill_ttft(engine, size, seed=size + 1)
            row["prefill"][size] = {"ttft_s": ttft, "prompt_tokens": counted}
            save()
        metrics = engine.metrics()
        row["offload"] = offload_counts(metrics)
        row["peak_memory"] = sampler.result() if sampler else peak_memory(engine, metrics, None)
        save()
    finally:
        engine.stop()


def ram_cap(row: dict, per_layer: list[int], bandwidth: float) -> dict | None:
    """The decode rate the CPU part allows when bandwidth is its only limit, and the share of
    it the served batch-1 decode reached. Layers go to RAM first-to-last (--n-cpu-moe)."""
    layers = row.get("placement", {}).get("layers_in_ram")
    if not layers:
        return None
    moved = sum(per_layer[:layers])
    rate = row.get("decode_tok_s", {}).get(1)
    return {"bytes_per_token": moved, "tok_s": bandwidth / moved,
            "pct": 100 * rate * moved / bandwidth if rate else None}


def goals(r: dict) -> dict[str, bool]:
    """Issue 30's goals, judged where this run measured them (on CUDA only). --cpu-moe's row:
    the placement cpu-moe, alone or with more flags (+moe-cache=0, as its cap assumes)."""
    from engined.config import parse_size

    rows, verdicts = r.get("placements", {}), {}
    cpu = next((row for name, row in rows.items() if name.split("+")[0] == "cpu-moe"), {})
    cap, cpu_rate = cpu.get("ram_cap") or {}, cpu.get("decode_tok_s", {}).get(1)
    if cap.get("pct") is not None:
        verdicts["--cpu-moe decode >= 60% of the RAM-bandwidth cap"] = cap["pct"] >= 60
    for name, row in rows.items():
        uncached = rows.get(f"{name}+moe-cache=0", {}).get("decode_tok_s", {}).get(1)
        rate = row.get("decode_tok_s", {}).get(1)
        if uncached and rate:  # the expert cache at its planned default, these routes
            verdicts[f"--{name.replace('=', ' ')} decode >= 1.25x with --moe-cache 0"] = (
                rate >= 1.25 * uncached)
        if not name.startswith("gpu-memory=") or "+" in name:
            continue
        budget = name.partition("=")[2]
        if rate and cpu_rate:
            verdicts[f"--gpu-memory {budget} decode >= 2.5x --cpu-moe"] = rate >= 2.5 * cpu_rate
        peak = row.get("peak_memory", {}).get("bytes")
        if peak:
            verdicts[f"--gpu-memory {budget} peak <= {budget}"] = peak <= parse_size(budget)
    return verdicts


def steps_text(off: dict) -> str:
    """How the decode steps ran (a piecewise graph, or eager after a capture failed)."""
    steps = ", ".join(f"{n:.0f} {mode}" for mode, n in off.get("decode_steps", {}).items())
    failures = off.get("graph_capture_failures", NOT_EXPOSED)
    failed = f"{failures:.0f}" if isinstance(failures, (int, float)) else failures
    looked = off.get("cache_hits", 0) + off.get("cache_misses", 0)
    cache = f"; expert cache hits {100 * off['cache_hits'] / looked:.0f}% of {looked:.0f}" if looked else ""
    return f"decode steps {steps or 'not counted'}, graph capture failures {failed}{cache}"


def summary(r: dict) -> list[str]:
    bw = r.get("ram_read", {})
    trace = r.get("route_trace")
    routes = f"routes of {trace['file']} ({trace['shape']})" if trace else "random routers"
    lines = [f"offload {r['model']} on {r.get('device_name', r['device'])}, host {r['host']}, "
             f"RAM read {bw.get('gbs', 0):.1f} GB/s on {r['threads']} threads, {routes}:"]
    for name, row in r.get("placements", {}).items():
        if "error" in row:
            lines.append(f"  --{name}: FAILED: {row['error'].splitlines()[0]}")
            continue
        place, off = row.get("placement", {}), row.get("offload", {})
        rates = ", ".join(f"{n} stream(s) {v:.1f} tok/s" for n, v in row.get("decode_tok_s", {}).items())
        ttft = ", ".join(f"{n}-token prefill TTFT {v['ttft_s']:.2f} s"
                         for n, v in row.get("prefill", {}).items())
        part = [f"  --{name.replace('=', ' ')}: experts of {place.get('layers_in_ram', '?')} of "
                f"{place.get('moe_layers', '?')} MoE layers in RAM; decode {rates or 'not measured'}; "
                f"{ttft or 'prefill not measured'}; offload calls {off.get('moe_calls', 0):.0f}; "
                f"{steps_text(off)}"]
        cap, peak = row.get("ram_cap"), row.get("peak_memory")
        if cap:
            reached = f", served batch 1 = {cap['pct']:.0f}% of it" if cap["pct"] is not None else ""
            part.append(f"RAM cap {cap['bytes_per_token'] / 1e6:.1f} MB/token = "
                        f"{cap['tok_s']:.1f} tok/s{reached}")
        if peak:
            part.append(f"peak {peak['bytes'] / 2**30:.2f} GiB ({peak['source']})")
        lines.append("; ".join(part))
    if r["device"] != "cuda":
        return lines + ["  goals: set for the GPU machine, not judged on the CPU"]
    return lines + [f"  goal {goal}: {'met' if met else 'NOT met'}"
                    for goal, met in r.get("goals_met", {}).items()]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:kimi-linear-48b")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--placements", type=placements,
                    default="gpu-memory=24GiB,gpu-memory=24GiB+moe-cache=0,cpu-moe+moe-cache=0",
                    help="serve flags to compare, NAME[=VALUE] each (+ joins flags), comma-separated")
    ap.add_argument("--streams", type=sizes, default=(1,), help="concurrent decode streams")
    ap.add_argument("--prefill", type=sizes, default=(8192,), help="prompt tokens")
    ap.add_argument("--decode-only", type=lambda text: set(text.split(",")), default=set(),
                    metavar="NAMES", help="placements whose prefill is not measured, comma-separated")
    ap.add_argument("--route-trace", type=pathlib.Path, metavar="FILE",
                    help="the experts in RAM follow this trace (KIMI_ROUTE_TRACE), every engine")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3, help="decode runs per stream count")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="engine and probe CPU threads (default: every core this process may use)")
    ap.add_argument("--probe-mib", type=int, default=1024, help="read-bandwidth buffer")
    ap.add_argument("--start-timeout", type=float, default=150)
    ap.add_argument("--out", type=pathlib.Path, required=True, help="folder for offload.json")
    ap.add_argument("--record", metavar="RESULTS_MD", help="append the summary line here")
    args = ap.parse_args(argv)
    args.max_context = max(args.prefill) + 128
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = helper_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    on_sigterm()  # a section's time limit: the engine is stopped on the way out
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "device": args.device, "host": hardware(),
              "threads": args.threads, "new_tokens": args.new_tokens, "placements": {}}

    def save():
        (args.out / "offload.json").write_text(json.dumps(result, indent=2) + "\n")

    bandwidth = ram_read_bandwidth(args.threads, args.probe_mib)
    result["ram_read"] = {"gbs": bandwidth / 1e9, "mib": args.probe_mib,
                          "source": "the C helper's read_probe, median of 7 passes"}
    per_layer = routed_bytes_per_token(args.model)
    result["routed_bytes_per_token_per_moe_layer"] = per_layer
    if args.route_trace:  # refused before any engine starts when it does not fit the model
        import route_trace
        try:
            result["route_trace"] = route_trace.for_engines(args.route_trace, args.model, len(per_layer))
        except (OSError, ValueError) as exc:
            print(f"bench/offload.py: --route-trace: {exc}", file=sys.stderr)
            return 2
    save()
    failed = False
    for name, flags in args.placements:
        row = result["placements"][name] = {"flags": list(flags)}
        try:
            measure_placement(args, name, flags, row, save)
        except Exception as exc:  # noqa: BLE001 - one placement failing leaves the other's numbers
            row["error"], failed = f"{type(exc).__name__}: {exc}", True
        row["ram_cap"] = ram_cap(row, per_layer, bandwidth)
        save()
    if args.device == "cuda":
        import torch
        result["device_name"] = torch.cuda.get_device_name()
    result["goals_met"] = goals(result) if args.device == "cuda" else {}
    save()
    lines = summary(result)
    print("\n".join(lines))
    if args.record:
        record_line(args.record, lines, " ".join(["python bench/offload.py", *(argv or sys.argv[1:])]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
