"""Served decode and prefill of a synthetic Kimi-Linear model, beside the batch-1 roofline.

    python bench/serve_streams.py --device cuda --out DIR          # bash bench/gpu_run.sh serve
    .venv/bin/python bench/serve_streams.py --model synthetic:small --device cpu \\
        --streams 1,2 --prefill 256 --new-tokens 16 --runs 1 --out DIR    # --dry-run's sizes

Starts `python -m engined serve` on a temporary socket (its log: DIR/NAME-engine.log, NAME
serve unless --name) and measures through it, cheapest and most decisive first, each phase
saved to DIR/NAME.json as soon as measured (a section killed at its time limit keeps what it
measured):
- at start, before any request: the batch-1 roofline, the decode graphs the engine captured
  (its log's lines; failures also from kimi_engine_graph_capture_failures_total, when this
  build exposes it, else "not exposed by this build", never a 0 it did not report) and peak
  memory, with its source (bench/served.py: the engine's own metric when exposed, else
  nvidia-smi's used memory of the engine's process, CUDA context included, else the VmHWM);
- decode: aggregate tok/s of 1 and 8 concurrent greedy streams of --new-tokens each, plain
  decode (each request says "speculative": false; the drafts tested are recorded: 0), over
  the window where every stream decodes (from the last stream's first token to the first
  stream's last), the median of --runs after one short warm-up at each count; then the
  decode steps by how they ran (graph replay or eager), from the engine's metrics;
- prefill: TTFT of a P-token prompt of fresh random ids (the prefix cache misses) = latency
  of a non-streamed request with max_tokens 1, once per size after a 512-token warm-up,
  the longest last;
- depth: the longest prefill streams --depth-tokens more tokens (plain decode) after its
  first (its TTFT is then that first token's arrival): batch-1 decode tok/s at that context,
  against the 1-stream rate above (issue 24: at 32k >= 50% of it; the short prompts there
  make it a stricter bar than 1k);
- beside (unless --no-beside): the longest prefill once more while one greedy stream decodes
  (bench/beside.py): its TTFT, and the stream's slowest step against its lone one.
Roofline: the bytes one batch-1 decode step reads (engined.commands.bench.bytes_per_token:
non-expert weights, 8/256 of each MoE layer's routed experts, the LM head, KDA state read and
written, MLA latents at the bench context; planned on the meta device, nothing allocated) /
the device's copy bandwidth, measured in a child process before the engine starts (so this
process holds no CUDA context beside the engine's). Needs only the standard library, torch
and engined, as on the GPU image.
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from beside import beside_line, context_room, judged, prefill_beside_decode  # noqa: E402
from common import BENCH, concurrent_chunks, record_line, unix_post  # noqa: E402
from prefill_requests import prefill_ttft, ttft_then_decode  # noqa: E402
from served import Engine, GpuMemorySampler, on_sigterm, peak_memory  # noqa: E402

GRAPH_FAILURES = "kimi_engine_graph_capture_failures_total"
DECODE_STEPS = "kimi_engine_decode_steps_total{"
SPEC_DRAFTS = "kimi_engine_spec_draft_tokens_total"
NOT_EXPOSED = "not exposed by this build"
CAPTURED_RE = re.compile(r"captured the decode step for (\d+) rows")
FAILED_RE = re.compile(r"CUDA graph capture failed for (\d+) rows")
EAGER_RE = re.compile(r"decode runs eagerly \((.*)\)|no capturable decode step")
DROPPED = "decode graphs dropped"


def stream_prompts(count: int) -> list[str]:
    return [f"Stream {i}: the quick brown fox number {i} jumps." for i in range(count)]


def prompt_tokens(engine: Engine, prompt: str) -> int:
    conn, resp = unix_post(engine.sock, "/tokenize", {"prompt": prompt})
    count = json.loads(resp.read())["count"]
    conn.close()
    return count


def steady_rate(streams: list[list[tuple[float, int]]]) -> float:
    """Aggregate tok/s while every stream decodes: the tokens that arrived after the last
    stream's first chunk, up to the first stream's last chunk, over that window. Streams that
    never decode together (an empty window): tokens after each stream's first / first to
    last token of any (bench/kimi_streams.py's count)."""
    start, end = max(s[0][0] for s in streams), min(s[-1][0] for s in streams)
    if end > start:
        tokens = sum(n for s in streams for t, n in s if start < t <= end)
        if tokens:
            return tokens / (end - start)
    tokens = sum(n for s in streams for _, n in s[1:])
    span = max(s[-1][0] for s in streams) - min(s[0][0] for s in streams)
    return tokens / span if span > 0 else float("nan")


def run_streams(sock: str, prompts: list[str], max_tokens: int) -> float:
    """Plain decode ("speculative": false): the rate the roofline bounds. Where the model
    verifies drafts (Kimi-Linear on the CPU; not yet on a GPU), a synthetic model's drafts
    say nothing of real text's; kimi_verify's rows in quick time the verify."""
    return steady_rate([[(t, len(ids)) for t, ids in chunks]
                        for chunks in concurrent_chunks(sock, prompts, max_tokens, False)])


def decode_rates(engine: Engine, args):
    """-> (streams, median aggregate tok/s), one stream count at a time."""
    prompts = stream_prompts(max(args.streams, default=0))
    for n in args.streams:
        run_streams(engine.sock, prompts[:n], 8)  # warm-up: kernels and their tuning at this batch
        rates = [run_streams(engine.sock, prompts[:n], args.new_tokens) for _ in range(args.runs)]
        yield n, statistics.median(rates)


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


COPY_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); import common; "
              "print(common.device_name(sys.argv[2])); print(common.copy_bandwidth(sys.argv[2], "
              "int(sys.argv[3])))")


def copy_bandwidth(device_type: str, mib: int) -> tuple[str, float]:
    """(device name, bytes/s of a `mib` MiB copy, read + write), from a child process."""
    out = subprocess.run([sys.executable, "-c", COPY_CHILD, str(BENCH), device_type, str(mib)],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    name, bandwidth = out.strip().splitlines()[-2:]
    return name, float(bandwidth)


def decode_graphs(log: str, metrics: dict[str, float]) -> dict:
    """What the engine's log says of its decode graphs, and its failure counter."""
    eager = EAGER_RE.search(log)
    return {"captured_buckets": sorted(int(b) for b in CAPTURED_RE.findall(log)),
            "failed_buckets": sorted(int(b) for b in FAILED_RE.findall(log)),
            "eager": eager.group(0) if eager else None, "dropped": log.count(DROPPED),
            "failures_metric": metrics.get(GRAPH_FAILURES, NOT_EXPOSED)}


def decode_steps(metrics: dict[str, float]) -> dict[str, float]:
    """kimi_engine_decode_steps_total by mode: {"graph": n, "eager": n}."""
    steps: dict[str, float] = {}
    for name, value in metrics.items():
        if name.startswith(DECODE_STEPS):
            mode = re.search(r'mode="(\w+)"', name)[1]
            steps[mode] = steps.get(mode, 0) + value
    return steps


def goals(r: dict) -> dict[str, bool]:
    """Issues 15's and 29's goals on an H200, judged where this run measured them."""
    rates, prefill, roof = r.get("decode_tok_s", {}), r.get("prefill", {}), r.get("roofline")
    verdicts = {}
    if roof and roof["pct"] is not None:
        verdicts["batch-1 decode >= 60% of the roofline"] = roof["pct"] >= 60
    if 1 in rates and 8 in rates:
        verdicts["8 streams >= 5x one stream"] = rates[8] >= 5 * rates[1]
    if 32768 in prefill:
        verdicts["32k-token prefill <= 3 s"] = prefill[32768]["ttft_s"] <= 3
    if 131072 in prefill:
        verdicts["128k-token prefill <= 15 s"] = prefill[131072]["ttft_s"] <= 15
    depth = r.get("decode_at_depth", {})
    if depth.get("context", 0) >= 32768 and depth.get("tok_s") and 1 in rates:
        verdicts["decode at a 32k context >= 50% of one short stream's"] = (
            depth["tok_s"] >= 0.5 * rates[1])
    beside = r.get("prefill_beside_decode")
    if beside and beside["size"] >= 32768 and judged(beside) is not None:
        verdicts["a stream decoding beside the 32k prefill: no gap between its tokens over 2x "
                 "its lone step"] = judged(beside)
    return verdicts


def summary(r: dict) -> list[str]:
    lines = [f"serve {r['model']} on {r.get('device_name', r['device'])}:"]
    rates = r.get("decode_tok_s", {})
    one = rates.get(1) or rates.get("1")
    for n, rate in rates.items():
        lines.append(f"  decode {n} stream(s): {rate:.1f} tok/s aggregate"
                     + (f", {rate / one:.2f}x one stream" if one else ""))
    if r.get("decode_steps"):
        lines.append("  decode steps: " + ", ".join(f"{v:.0f} {mode}"
                                                    for mode, v in r["decode_steps"].items()))
    for size, row in r.get("prefill", {}).items():
        lines.append(f"  prefill {size} tokens: TTFT {row['ttft_s']:.3f} s "
                     f"({row['prompt_tokens']} prompt tokens counted)")
    depth = r.get("decode_at_depth")
    if depth:
        lines.append(f"  decode at a {depth['context']}-token context: " + (
            f"{depth['tok_s']:.1f} tok/s" + (f", {depth['tok_s'] / one:.2f}x one short stream"
                                             if one else "") if "tok_s" in depth else depth["error"]))
    if "prefill_beside_decode" in r:
        lines.append("  " + beside_line(r["prefill_beside_decode"]))
    roof = r.get("roofline")
    if roof:
        served = f"{roof['pct']:.1f}%" if roof["pct"] is not None else "not measured"
        lines.append(f"  roofline batch 1: {roof['bytes_per_token'] / 1e6:.1f} MB read/token at "
                     f"context {roof['context']} / {roof['bandwidth_gbs']:.1f} GB/s measured copy "
                     f"bandwidth = {roof['tok_s']:.1f} tok/s; served batch 1 = {served} of it")
    graphs = r.get("graphs", {})
    lines.append(f"  decode graphs captured for {graphs.get('captured_buckets', '?')} rows, "
                 f"failed for {graphs.get('failed_buckets', '?')}, dropped "
                 f"{graphs.get('dropped', '?')} times; graph capture failures: "
                 f"{r.get('graph_capture_failures', 'not measured')}")
    for key in ("peak_memory_at_start", "peak_memory"):
        if key in r:
            lines.append(f"  {key.replace('_', ' ')}: {r[key]['bytes'] / 2**30:.2f} GiB "
                         f"({r[key]['source']})")
    if r["device"] != "cuda":
        return lines + ["  goals: set for an H200, not judged on the CPU"]
    return lines + [f"  goal {goal}: {'met' if met else 'NOT met'}"
                    for goal, met in goals(r).items()]


def at_start(engine: Engine, args, result: dict, sampler):
    """Before any request: the roofline, the decode graphs and the peak memory of the start."""
    result["decode_prompt_tokens"] = prompt_tokens(engine, stream_prompts(1)[0])
    context = result["decode_prompt_tokens"] + args.new_tokens // 2  # halfway through decode
    moved = bytes_per_token(args.model, args.device, context)
    if moved:
        bandwidth = result["copy_bandwidth_gbs"] * 1e9
        result["roofline"] = {"bytes_per_token": moved, "context": context, "pct": None,
                              "tok_s": bandwidth / moved, "bandwidth_gbs": bandwidth / 1e9}
    metrics = engine.metrics()
    result["graphs"] = decode_graphs(engine.log.read_text(errors="replace"), metrics)
    result["graph_capture_failures"] = metrics.get(GRAPH_FAILURES, NOT_EXPOSED)
    result["peak_memory_at_start"] = peak_memory(engine, metrics, sampler)


def measure(args, result: dict, save):
    batch = max([*args.streams, 2 if args.beside else 1])  # beside: a stream and the prefill
    engine = Engine(args.model, args.device, args.max_context, batch, args.threads,
                    args.start_timeout, log=args.out / f"{args.name}-engine.log")
    sampler = GpuMemorySampler.start_for(engine) if args.device == "cuda" else None
    try:
        at_start(engine, args, result, sampler)
        save()
        print("\n".join(summary(result)[1:-1]))
        for n, rate in decode_rates(engine, args):
            result["decode_tok_s"][n] = rate
            print(f"serve_streams: decode {n} stream(s): {rate:.1f} tok/s aggregate")
            if n == 1 and "roofline" in result:
                result["roofline"]["pct"] = 100 * rate / result["roofline"]["tok_s"]
            save()
        metrics = engine.metrics()
        result["decode_steps"] = decode_steps(metrics)
        result["spec_draft_tokens"] = metrics.get(SPEC_DRAFTS, NOT_EXPOSED)  # 0: plain decode
        save()
        if args.prefill:
            prefill_ttft(engine, min(512, *args.prefill), seed=0)  # warm-up: the prefill kernels
        for size in args.prefill:
            if size == max(args.prefill) and args.depth_tokens:  # then decode at its depth
                ttft, counted, rate = ttft_then_decode(engine, size, size + 1, args.depth_tokens)
                result["decode_at_depth"] = {"context": size, "new_tokens": args.depth_tokens,
                                             **({"tok_s": rate} if rate else {"error": "no rate"})}
                print(f"serve_streams: decode at a {size}-token context: "
                      + (f"{rate:.1f} tok/s" if rate else "no rate (one chunk)"))
            else:
                ttft, counted = prefill_ttft(engine, size, seed=size + 1)
            result["prefill"][size] = {"ttft_s": ttft, "prompt_tokens": counted}
            print(f"serve_streams: prefill {size} tokens: TTFT {ttft:.3f} s")
            save()
        if args.beside and args.prefill:  # the longest again, a decode stream beside it
            size = max(args.prefill)
            try:
                row = prefill_beside_decode(engine.sock, size, seed=size + 2)
            except Exception as exc:  # noqa: BLE001  (what was measured before still counts)
                row = {"error": f"{type(exc).__name__}: {exc}"}
            result["prefill_beside_decode"] = {"size": size, **row}
            print(f"serve_streams: {beside_line(result['prefill_beside_decode'])}")
            save()
        metrics = engine.metrics()
        result["generated_tokens"] = metrics.get("kimi_engine_generated_tokens_total", 0)
        result["graph_capture_failures"] = metrics.get(GRAPH_FAILURES, NOT_EXPOSED)
        result["peak_memory"] = peak_memory(engine, metrics, sampler)
        save()
    finally:
        engine.stop()


def sizes(text: str) -> tuple[int, ...]:
    return () if text == "none" else tuple(int(s) for s in text.split(","))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:kimi-linear-48b")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--streams", type=sizes, default=(1, 8),
                    help="stream counts to decode, in order; none: no decode phase")
    ap.add_argument("--prefill", type=sizes, default=(8192, 32768),
                    help="prompt tokens, each once, in this order")
    ap.add_argument("--no-beside", dest="beside", action="store_false",
                    help="skip the longest prefill's second run, with a stream decoding beside it")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens per decode stream")
    ap.add_argument("--depth-tokens", type=int, default=64,
                    help="tokens decoded after the longest prefill's prompt (0: none)")
    ap.add_argument("--runs", type=int, default=2, help="decode runs per stream count")
    ap.add_argument("--max-context", type=int,
                    help="default: the longest prefill + 128, and the beside stream's tokens")
    ap.add_argument("--threads", type=int, help="engine CPU threads")
    ap.add_argument("--bandwidth-mib", type=int, default=2048, help="copy size for the bandwidth")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--out", type=pathlib.Path, required=True, help="folder for NAME.json")
    ap.add_argument("--name", default="serve", help="NAME.json and NAME-engine.log in --out")
    ap.add_argument("--record", metavar="RESULTS_MD", help="append the summary line here")
    args = ap.parse_args(argv)
    # room for the longest prompt and its token, and beside it the stream of bench/beside.py
    longest = max(args.prefill, default=512)
    args.max_context = args.max_context or (longest + max(128, args.depth_tokens + 2)
                                            + (context_room(longest) if args.beside else 0))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    on_sigterm()  # a section's time limit: the engine is stopped on the way out
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "device": args.device, "streams": list(args.streams),
              "new_tokens": args.new_tokens, "max_context": args.max_context,
              "decode_tok_s": {}, "prefill": {}}

    def save():
        (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")

    result["device_name"], bandwidth = copy_bandwidth(args.device, args.bandwidth_mib)
    result["copy_bandwidth_gbs"] = bandwidth / 1e9
    save()
    command = " ".join(["python bench/serve_streams.py", *(argv or sys.argv[1:])])
    try:
        measure(args, result, save)
    except BaseException:  # a section's limit (SIGTERM) or a failing phase: what was measured
        result["partial"] = True   # still goes to the record, marked so
        save()
        if args.record:
            first, *rest = summary(result)
            record_line(args.record, ["(partial: cut short) " + first, *rest], command)
        raise
    result["goals_met"] = goals(result) if args.device == "cuda" else {}
    save()
    lines = summary(result)
    print("\n".join(lines))
    if args.record:
        record_line(args.record, lines, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
