"""Served decode and prefill of a synthetic Kimi-Linear model, beside the batch-1 roofline.

    python bench/serve_streams.py --device cuda --out DIR          # bash bench/gpu_run.sh serve
    .venv/bin/python bench/serve_streams.py --model synthetic:small --device cpu \\
        --streams 1,2 --prefill 256 --new-tokens 8 --runs 1 --out DIR     # --dry-run's sizes

Starts `python -m engined serve` on a temporary socket and measures through it:
- decode: aggregate tok/s of 1, 2, 4 and 8 concurrent greedy streams, counted as
  bench/kimi_streams.py counts (tokens after each stream's first / first to last token of
  any), the median of --runs after one warm-up at each count;
- prefill: TTFT of a P-token prompt of fresh random ids (the prefix cache misses) = latency
  of a non-streamed request with max_tokens 1, the median of --prefill-runs;
- graph capture failures: the engine's kimi_engine_graph_capture_failures_total, when this
  build exposes it (else "not exposed by this build", never a 0 it did not report);
- peak memory, with its source (bench/served.py): the engine's own metric when exposed, else
  nvidia-smi's used memory of the engine's process (CUDA context included), else the VmHWM.
Roofline: the bytes one batch-1 decode step reads (engined.commands.bench.bytes_per_token:
non-expert weights, 8/256 of each MoE layer's routed experts, the LM head, KDA state read and
written, MLA latents at the bench context; planned on the meta device, nothing allocated) /
the device's copy bandwidth, measured here once the engine has stopped. Needs only the
standard library, torch and engined, as on the GPU image. Partial results are written to
--out after each phase, so a section killed at its time limit still leaves what it measured.
"""
import argparse
import json
import pathlib
import random
import signal
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import hardware, unix_post  # noqa: E402
from kimi_streams import aggregate  # noqa: E402
from served import Engine, GpuMemorySampler, peak_memory  # noqa: E402

GRAPH_FAILURES = "kimi_engine_graph_capture_failures_total"
NOT_EXPOSED = "not exposed by this build"


def stream_prompts(count: int) -> list[str]:
    return [f"Stream {i}: the quick brown fox number {i} jumps." for i in range(count)]


def prompt_tokens(engine: Engine, prompt: str) -> int:
    conn, resp = unix_post(engine.sock, "/tokenize", {"prompt": prompt})
    count = json.loads(resp.read())["count"]
    conn.close()
    return count


def decode_rates(engine: Engine, args):
    """-> (streams, median aggregate tok/s), one stream count at a time."""
    prompts = stream_prompts(max(args.streams))
    for n in args.streams:
        aggregate(engine.sock, prompts[:n], 4)  # warm-up: kernels and their tuning at this batch
        yield n, statistics.median(aggregate(engine.sock, prompts[:n], args.new_tokens)[0]
                                   for _ in range(args.runs))


def prefill_ttft(engine: Engine, num_tokens: int, seed: int) -> tuple[float, int]:
    """(seconds to a 1-token reply, prompt tokens the engine counted) for fresh byte-token ids."""
    ids = random.Random(seed).choices(range(256), k=num_tokens)
    start = time.perf_counter()
    conn, resp = unix_post(engine.sock, "/v1/completions", {
        "model": "default", "prompt": ids, "max_tokens": 1, "temperature": 0})
    body = json.loads(resp.read())
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"prefill of {num_tokens} tokens: HTTP {resp.status}: {body}")
    return time.perf_counter() - start, body["usage"]["prompt_tokens"]


def prefill_ttfts(engine: Engine, args):
    """-> (prompt tokens, {"ttft_s": median, "prompt_tokens": as counted}), one size at a time."""
    prefill_ttft(engine, min(args.prefill), seed=0)  # warm-up
    for size in args.prefill:
        runs = [prefill_ttft(engine, size, seed=size + run + 1) for run in range(args.prefill_runs)]
        yield size, {"ttft_s": statistics.median(r[0] for r in runs), "prompt_tokens": runs[0][1]}


def bytes_per_token(spec: str, device_type: str, context: int) -> int | None:
    """Batch-1 decode bytes of a synthetic model, planned on the meta device with the dtypes
    synthetic.build gives it on `device_type`; None for any other model."""
    import torch

    from engined.commands.bench import bytes_per_token as moved
    from engined.models.kimi_linear import KimiLinearModel
    from engined.models.kimi_linear_config import parse_config
    from engined.weights import synthetic

    if not synthetic.is_synthetic(spec):
        return None
    config = parse_config(synthetic.config_of(spec))
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    model = KimiLinearModel(config, dtype, "meta", synthetic.selective_int4(config), torch.bfloat16)
    return moved(model, context)


def copy_bandwidth(device_type: str, mib: int) -> tuple[str, float]:
    """(device name, bytes/s of a large tensor copy, bytes read + written, best of 5)."""
    import torch

    src = torch.empty(mib << 20, dtype=torch.uint8, device=device_type)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    dst.copy_(src)
    times = []
    for _ in range(5):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    name = torch.cuda.get_device_name() if device_type == "cuda" else hardware()
    return name, 2 * src.numel() / min(times)


def goals(r: dict) -> dict[str, bool]:
    """Issue 15's goals on an H200, judged where this run measured them."""
    rates, prefill, roof = r.get("decode_tok_s", {}), r.get("prefill", {}), r.get("roofline")
    verdicts = {}
    if roof and roof["pct"] is not None:
        verdicts["batch-1 decode >= 60% of the roofline"] = roof["pct"] >= 60
    if 1 in rates and 8 in rates:
        verdicts["8 streams >= 5x one stream"] = rates[8] >= 5 * rates[1]
    if 32768 in prefill:
        verdicts["32k-token prefill <= 3 s"] = prefill[32768]["ttft_s"] <= 3
    return verdicts


def summary(r: dict) -> list[str]:
    lines = [f"serve {r['model']} on {r.get('device_name', r['device'])}:"]
    rates = r.get("decode_tok_s", {})
    one = rates.get(1) or rates.get("1")
    for n, rate in rates.items():
        lines.append(f"  decode {n} stream(s): {rate:.1f} tok/s aggregate"
                     + (f", {rate / one:.2f}x one stream" if one else ""))
    for size, row in r.get("prefill", {}).items():
        lines.append(f"  prefill {size} tokens: TTFT {row['ttft_s']:.3f} s "
                     f"({row['prompt_tokens']} prompt tokens counted)")
    roof = r.get("roofline")
    if roof:
        served = f"{roof['pct']:.1f}%" if roof["pct"] is not None else "not measured"
        lines.append(f"  roofline batch 1: {roof['bytes_per_token'] / 1e6:.1f} MB read/token at "
                     f"context {roof['context']} / {roof['bandwidth_gbs']:.1f} GB/s measured copy "
                     f"bandwidth = {roof['tok_s']:.1f} tok/s; served batch 1 = {served} of it")
    lines.append(f"  graph capture failures: {r.get('graph_capture_failures', 'not measured')}")
    peak = r.get("peak_memory")
    if peak:
        lines.append(f"  peak memory: {peak['bytes'] / 2**30:.2f} GiB ({peak['source']})")
    if r["device"] != "cuda":
        return lines + ["  goals: set for an H200, not judged on the CPU"]
    return lines + [f"  goal {goal}: {'met' if met else 'NOT met'}"
                    for goal, met in goals(r).items()]


def measure(args, result: dict, save):
    engine = Engine(args.model, args.device, args.max_context, max(args.streams), args.threads,
                    args.start_timeout)
    sampler = GpuMemorySampler.start_for(engine) if args.device == "cuda" else None
    try:
        result["decode_prompt_tokens"] = prompt_tokens(engine, stream_prompts(1)[0])
        result["decode_tok_s"], result["prefill"] = {}, {}
        for n, rate in decode_rates(engine, args):
            result["decode_tok_s"][n] = rate
            save()
        for size, row in prefill_ttfts(engine, args):
            result["prefill"][size] = row
            save()
        metrics = engine.metrics()
        result["generated_tokens"] = metrics.get("kimi_engine_generated_tokens_total", 0)
        result["graph_capture_failures"] = metrics.get(GRAPH_FAILURES, NOT_EXPOSED)
        result["peak_memory"] = peak_memory(engine, metrics, sampler)
        save()
    finally:
        engine.stop()


def sizes(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(","))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:kimi-linear-48b")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--streams", type=sizes, default=(1, 2, 4, 8))
    ap.add_argument("--prefill", type=sizes, default=(8192, 32768), help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3, help="decode runs per stream count")
    ap.add_argument("--prefill-runs", type=int, default=2)
    ap.add_argument("--max-context", type=int, help="default: the longest prefill + 128")
    ap.add_argument("--threads", type=int, help="engine CPU threads")
    ap.add_argument("--bandwidth-mib", type=int, default=2048, help="copy size for the bandwidth")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--out", type=pathlib.Path, required=True, help="folder for serve.json")
    ap.add_argument("--record", metavar="RESULTS_MD", help="append the summary line here")
    args = ap.parse_args(argv)
    args.max_context = args.max_context or max(args.prefill) + 128
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a section timeout: stop the engine
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "device": args.device, "streams": list(args.streams),
              "new_tokens": args.new_tokens, "max_context": args.max_context}

    def save():
        (args.out / "serve.json").write_text(json.dumps(result, indent=2) + "\n")

    measure(args, result, save)
    context = result["decode_prompt_tokens"] + args.new_tokens // 2  # halfway through decode
    moved = bytes_per_token(args.model, args.device, context)
    result["device_name"], bandwidth = copy_bandwidth(args.device, args.bandwidth_mib)
    if moved:
        roofline = bandwidth / moved
        result["roofline"] = {"bytes_per_token": moved, "context": context, "tok_s": roofline,
                              "bandwidth_gbs": bandwidth / 1e9,
                              "pct": 100 * result["decode_tok_s"][1] / roofline
                              if 1 in result["decode_tok_s"] else None}
    result["goals_met"] = goals(result) if args.device == "cuda" else {}
    save()
    lines = summary(result)
    print("\n".join(lines))
    if args.record:
        command = " ".join(["python bench/serve_streams.py", *(argv or sys.argv[1:])])
        with open(args.record, "a") as f:
            f.write(f"- {time.strftime('%Y-%m-%d')} {lines[0]} "
                    + "; ".join(line.strip() for line in lines[1:]) + f" (`{command}`)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
