"""The first two minutes of a GPU run: how fast the served decode step is, and where its time goes.

    python bench/gpu_quick.py --out DIR --record DIR/RESULTS.add.md   # bash bench/gpu_run.sh quick
    .venv/bin/python bench/gpu_quick.py --dry-run --out DIR        # the same on the CPU, tiny

Phases, each written to DIR/quick.json and DIR/quick.txt as soon as it is measured (a run
killed at its limit keeps the phases before; a phase that fails is recorded and the next
runs):
- env: torch, triton, the device and its copy bandwidth (bench/common.py: CUDA events).
- decode: synthetic kimi-linear-48b INT4 built on the device, batch-1 greedy decode in
  process through the engine's runner, as `python -m engined.commands.bench` measures it
  (its build, make_runner, decode_run: a CUDA graph replay per step; the cache made before
  capture), --runs runs of --new-tokens tokens after a warm-up, median; the steps by how they
  ran (graph or eager); the roofline: bytes read per token over the device's peak bandwidth
  and over the measured copy bandwidth.
- profile: one decode step under torch.profiler, twice: one graph replay (runner.decode, as
  served), then one eager model.decode_rows on that step's inputs. Each: GPU kernels and
  memcpy/memset per step, GPU-busy ms (the union of their intervals) beside the step's wall
  ms (median of 10 unprofiled steps), and the top 15 kernels by total time. On the CPU
  (--dry-run: synthetic tiny) the profiler sees no GPU: it counts aten ops, by self CPU time.
- verify: what Kimi-Linear's speculative verify costs, k = 1, 2, 4, 8 drafts as k + 1 rows of
  one eager step, all accepted and all rejected, against the eager one-row step
  (bench/kimi_verify.py), the served step's ms beside them.
The phases' short prompts go through KDA's reference prefill (PREFILL): fla-core's chunk_kda,
CUDA's default, autotunes its kernels on first call, dozens of compiles that a 120-s section
cannot spare, and it is the prefill section's to measure; a decode step never calls it.
"""
import argparse
import functools
import json
import pathlib
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import kimi_verify  # noqa: E402
from common import copy_bandwidth, device_name, record_line  # noqa: E402

from engined.commands import bench as synthetic_bench  # noqa: E402
from engined.ops import registry  # noqa: E402

PREFILL = ("kda_prefill", "reference")  # the variant the phases' prompts prefill with
TOP = 15
WALL_STEPS = 10
COPIES = ("Memcpy", "Memset")


def busy_us(spans: list[tuple[str, float, float]]) -> float:
    """The union of the (name, start us, end us) intervals: time the device did anything."""
    total, reached = 0.0, float("-inf")
    for _, start, end in sorted(spans, key=lambda s: s[1]):
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total


def top_by_time(rows: list[tuple[str, float]], top: int = TOP) -> list[dict]:
    """(name, us) per call -> the `top` names by total us: name, count, total_us."""
    by_name: dict[str, list] = {}
    for name, us in rows:
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += us
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return [{"name": name, "count": count, "total_us": total} for name, (count, total) in ranked]


def gpu_summary(spans: list[tuple[str, float, float]]) -> dict:
    """One step's device work (name, start us, end us) -> counts, busy and span, top kernels."""
    kernels = [s for s in spans if not s[0].startswith(COPIES)]
    return {"kernels": len(kernels), "copies": len(spans) - len(kernels),
            "busy_ms": busy_us(spans) / 1e3,
            "span_ms": (max(s[2] for s in spans) - min(s[1] for s in spans)) / 1e3 if spans else 0,
            "top": top_by_time([(name, end - start) for name, start, end in spans])}


def profile_step(step, is_cuda: bool) -> dict:
    """One call of `step` under torch.profiler -> gpu_summary on CUDA, aten ops on the CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
    with profile(activities=activities) as prof:
        step()
        sync(is_cuda)
    events = prof.events()
    if is_cuda:
        return gpu_summary([(e.name, e.time_range.start, e.time_range.end) for e in events
                            if e.device_type == DeviceType.CUDA])
    ops = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
    return {"aten_ops": len(ops),
            "top": top_by_time([(e.name, e.self_cpu_time_total) for e in ops])}


def wall_ms(step, is_cuda: bool, repeats: int = WALL_STEPS) -> float:
    times = []
    for _ in range(repeats):
        sync(is_cuda)
        start = time.perf_counter()
        step()
        sync(is_cuda)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def sync(is_cuda: bool):
    if is_cuda:
        torch.cuda.synchronize()


def versions() -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version}


def measure_env(args, r: dict) -> list[str]:
    bandwidth = copy_bandwidth(args.device, args.copy_mib)
    r["env"] = {**versions(), "device": device_name(args.device),
                "copy_bandwidth_gbs": bandwidth / 1e9, "copy_mib": args.copy_mib}
    e = r["env"]
    return [f"quick: torch {e['torch']} (CUDA {e['cuda']}), triton {e['triton']}, {e['device']}: "
            f"copy bandwidth {e['copy_bandwidth_gbs']:.1f} GB/s ({args.copy_mib} MiB, read + "
            f"write)"]


def measure_decode(args, r: dict, state: dict) -> list[str]:
    model = synthetic_bench.build(args.synthetic, args.device, int4=True)
    prompt_len = synthetic_bench.PROMPT_TOKENS
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g).to(args.device)
    cache = model.new_cache(prompt_len + synthetic_bench.NEW_TOKENS + 1)  # before the capture
    metrics = synthetic_bench.runner_metrics()
    runner, _ = synthetic_bench.make_runner(model, metrics)
    state.update(model=model, runner=runner, cache=cache)

    def run() -> float:
        return synthetic_bench.decode_run(model, runner, cache, prompt, args.new_tokens)[0]

    run()                                                          # warm-up: compiles, allocator
    secs = statistics.median(run() for _ in range(args.runs))
    moved = synthetic_bench.bytes_per_token(model, prompt_len + args.new_tokens // 2)
    d = r["decode"] = {
        "config": args.synthetic, "tok_s": 1 / secs, "ms_per_token": 1e3 * secs,
        "runs": args.runs, "new_tokens": args.new_tokens, "mode": synthetic_bench.mode_of(runner),
        "graph_buckets": sorted(runner.graphs), "decode_steps": {
            f"{mode} at batch {rows}": n
            for (mode, rows), n in sorted(metrics.decode_steps.counts.items())},
        "capture_failures": sum(metrics.graph_capture_failures.counts.values()),
        "mb_per_token": moved / 1e6, "weight_gb": model.weight_bytes / 1e9}
    copy_gbs = r.get("env", {}).get("copy_bandwidth_gbs", 0)
    d["roofline"] = rooflines(1 / secs, moved, args.device, copy_gbs)
    state["decode_line"] = decode_line(d, r.get("env", {}).get("device", args.device))
    return [state["decode_line"]]


ROOFLINES = {"peak": "the device's peak bandwidth", "copy": "the measured copy bandwidth"}


def rooflines(tok_s: float, moved: int, device: str, copy_gbs: float) -> dict:
    """Batch-1 ceilings, bytes per token over the device's peak bandwidth (the bench's table;
    none on the CPU) and over the measured copy bandwidth, and the share of each reached."""
    _, peak = synthetic_bench.peak_bandwidth(device)
    return {key: {"tok_s": bandwidth / moved, "pct": 100 * tok_s * moved / bandwidth}
            for key, bandwidth in (("peak", peak), ("copy", copy_gbs * 1e9)) if bandwidth}


def decode_line(d: dict, device: str) -> str:
    roofs = "; ".join(f"{v['tok_s']:.0f} tok/s at {ROOFLINES[key]} ({v['pct']:.1f}%)"
                      for key, v in d["roofline"].items())
    steps = ", ".join(f"{n:.0f} {mode}" for mode, n in d["decode_steps"].items()) or "none counted"
    return (f"decode synthetic {d['config']} INT4 on {device}: {d['tok_s']:.1f} tok/s "
            f"({d['ms_per_token']:.2f} ms/token), batch 1, median of {d['runs']} runs of "
            f"{d['new_tokens']} tokens, {d['mode']} (buckets {d['graph_buckets']}; steps "
            f"{steps}; capture failures {d['capture_failures']}); {d['mb_per_token']:.1f} MB "
            f"read/token; roofline {roofs or 'not measured'}")


def served_step(model, runner, cache):
    """One decode step as served: runner.decode, a graph replay where the runner has one."""
    return lambda: runner.decode([0], [cache], [cache.num_tokens])


def eager_step(model, runner, cache):
    """model.decode_rows on the inputs of the runner's captured one-row step (on the CPU, a
    step built for it), loaded with the cache's next position: what a replay runs, eagerly.
    Last: it reruns a position and reloads the captured step's inputs."""
    step = runner.graphs[1][1] if 1 in runner.graphs else model.graph_step(1, runner.max_context)
    step.load([0], [cache], [cache.num_tokens])
    return lambda: model.decode_rows(step.tokens, step.inputs)


def measure_profile(args, r: dict, state: dict, key: str) -> list[str]:
    """profile_graph: the served step (a graph replay on CUDA); profile_eager: decode_rows."""
    is_cuda, runner = args.device == "cuda", state["runner"]
    label, make = {"profile_graph": (f"{synthetic_bench.mode_of(runner)} step (runner.decode)",
                                     served_step),
                   "profile_eager": ("eager model.decode_rows", eager_step)}[key]
    step = make(state["model"], runner, state["cache"])
    step()                                                         # warm-up
    r[key] = {"step": label, "wall_ms": wall_ms(step, is_cuda), **profile_step(step, is_cuda)}
    return profile_lines(r[key])


def profile_lines(p: dict) -> list[str]:
    if "aten_ops" in p:
        head = (f"profile {p['step']}, one step: {p['aten_ops']} aten ops (no GPU on this "
                f"machine: CPU ops), wall {p['wall_ms']:.2f} ms")
        columns, total = ("op", "self CPU us", f"% of these {TOP}"), sum(
            row["total_us"] for row in p["top"])
    else:
        busy = 100 * p["busy_ms"] / p["wall_ms"] if p["wall_ms"] else 0
        head = (f"profile {p['step']}, one step: {p['kernels']} GPU kernels + {p['copies']} "
                f"memcpy/memset, GPU busy {p['busy_ms']:.2f} ms (first to last {p['span_ms']:.2f} "
                f"ms) of {p['wall_ms']:.2f} ms wall ({busy:.0f}% busy)")
        if not p["kernels"]:
            head += "; the profiler saw no kernel in this step (the eager profile has them)"
        columns, total = ("kernel", "total us", "% of GPU busy"), 1e3 * p["busy_ms"]
    return [head, "| {} | count | {} | {} |".format(*columns), "|---|---:|---:|---:|"] + [
        f"| {row['name'][:90]} | {row['count']} | {row['total_us']:.1f} | "
        f"{100 * row['total_us'] / (total or 1):.1f}% |" for row in p["top"]]


def measure_verify(args, r: dict, state: dict) -> list[str]:
    """verify: a sequence's input token and k drafts in one eager step (bench/kimi_verify.py)
    against the eager one-row step, beside the served step of the decode phase. Last: its
    draft slots grow the state pool, which the captured graphs no longer match."""
    v = r["verify"] = kimi_verify.measure(state["model"], steps=args.verify_steps, reps=3,
                                          prompt_len=16)   # step cost, not context: short prefills
    served = r.get("decode", {}).get("ms_per_token")
    label = f"verify ({args.synthetic}, eager)"
    return [f"verify: k drafts as k + 1 rows of one eager step; the served one-row step "
            f"({synthetic_bench.mode_of(state['runner'])}) took {served:.2f} ms"
            if served else "verify: k drafts as k + 1 rows of one eager step"] + kimi_verify.lines(v, label)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", default="kimi-linear-48b",
                    choices=sorted(synthetic_bench.synthetic_weights.CONFIGS))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--copy-mib", type=int, default=1024, help="copy size for the bandwidth")
    ap.add_argument("--dry-run", action="store_true",
                    help="on the CPU: synthetic tiny, a 64 MiB copy")
    ap.add_argument("--out", type=pathlib.Path, required=True,
                    help="folder for quick.json and quick.txt")
    ap.add_argument("--record", metavar="RESULTS_MD", help="append the decode line here")
    ap.add_argument("--verify-steps", type=int, default=4, help="steps per verify measurement")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.synthetic, args.device, args.copy_mib = "tiny", "cpu", 64
    if args.new_tokens > synthetic_bench.NEW_TOKENS:
        ap.error(f"--new-tokens: at most {synthetic_bench.NEW_TOKENS} (the runner's context)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result, text, state = {"errors": {}}, [], {}
    phases = [("env", lambda: measure_env(args, result)),
              ("decode", lambda: measure_decode(args, result, state))] + [
        (key, functools.partial(measure_profile, args, result, state, key))
        for key in ("profile_graph", "profile_eager")] + [
        ("verify", lambda: measure_verify(args, result, state))]
    with torch.inference_mode(), registry.using(*PREFILL):
        for name, phase in phases:
            if name in ("profile_graph", "profile_eager", "verify") and "runner" not in state:
                break
            try:
                lines = phase()
            except Exception as exc:  # noqa: BLE001 - one phase failing keeps the others' numbers
                traceback.print_exc()
                result["errors"][name] = f"{type(exc).__name__}: {exc}"
                lines = [f"{name}: FAILED: {result['errors'][name]}"]
            print("\n".join(lines), flush=True)
            if name == "decode" and args.record and "decode_line" in state:
                # the run's headline, recorded now: a step cut at its limit in a later phase
                # (verify's eager 48B steps) keeps it
                record_line(args.record, [state["decode_line"]], "python bench/gpu_quick.py")
            text.extend(lines)
            (args.out / "quick.json").write_text(json.dumps(result, indent=2) + "\n")
            (args.out / "quick.txt").write_text("\n".join(text) + "\n")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
