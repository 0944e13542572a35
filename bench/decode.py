"""make bench: decode and prefill speed of kimi-engine on the default model, served against
served: the engine over its Unix socket beside native llama-server over loopback HTTP (built
from the pinned llama.cpp sources by bench/llamacpp_build.sh, its default configuration), the
same token ids, both streaming; llama-bench's tg and pp on the same GGUF as the kernels'
ceiling; and HF transformers (fp32). llama-cpp-python's in-process binding runs too when it
is installed (earlier runs' baseline). Ratios are against llama-server.

Decode: 64 new tokens, greedy, 17-token prompt, 5 repeats after a warm-up, median tok/s. The
engine runs twice: with --speculative off (the "engine" row, plain decode, which the ratios
use) and in its default configuration, speculation on (the prompt repeats one paragraph, so
drafts from it are often right: that row shows what speculation adds on such text).
Prefill: a 512-token prompt, tok/s = 512 / time to first token, median of the same 5 repeats
(3 before 2026-12-07), with the engine's prefix cache off (the repeats send the same prompt).
Threads: 2 for everyone.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import hardware, record, stream_text_times  # noqa: E402

from engined.weights.default_model import default_gguf_path  # noqa: E402

NEW_TOKENS, DECODE_PROMPT, PREFILL_PROMPT, REPEATS = 64, 17, 512, 5
TEXT = ("The history of computing is a story of ideas that became machines and machines that "
        "changed ideas. Early calculators, punched cards and vacuum tubes gave way to ") * 64


def rss_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def engine_timed(sock: str, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
    """One streamed /v1/completions call: (ttft s, decode tok/s after the first token, tokens)."""
    start = time.perf_counter()
    first, last, count = stream_text_times(sock, prompt, max_tokens)
    decode = (count - 1) / (last - first) if count > 1 and last > first else float("nan")
    return first - start, decode, count


def bench_engine(gguf: pathlib.Path, tokens: list[int], speculative: str = "off") -> dict:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kimi-bench-"))
    sock = str(tmp / "engine.sock")
    env = dict(os.environ, XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(tmp / "cache")))
    baseline = subprocess.run([sys.executable, "-c", "import engined.serving.routes, engined.weights.loader, torch;"
                               "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"],
                              capture_output=True, text=True, env=env)
    proc = subprocess.Popen([str(pathlib.Path(sys.executable).parent / "kimi-engine"), "serve",
                             "--model", "default", "--socket", sock, "--threads", "2",
                             "--max-context", "8192", "--speculative", speculative,
                             # every repeat sends the same prompt: measure prefill, not the cache
                             "--prefix-cache-bytes", "0"], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 900
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        engine_timed(sock, tokens[:DECODE_PROMPT], 8)  # warm-up
        decode = [engine_timed(sock, tokens[:DECODE_PROMPT], NEW_TOKENS)[1] for _ in range(REPEATS)]
        prefill = [PREFILL_PROMPT / engine_timed(sock, tokens[:PREFILL_PROMPT], 1)[0]
                   for _ in range(REPEATS)]
        peak = rss_kib(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    base = int(baseline.stdout.strip() or 0)
    return {"decode_tok_s": statistics.median(decode), "prefill_tok_s": statistics.median(prefill),
            "peak_rss_mb": peak / 1024, "rss_above_import_mb": (peak - base) / 1024}


def bench_llamacpp(gguf: pathlib.Path, tokens: list[int]) -> dict | None:
    """llama.cpp (llama-cpp-python) in a child process: its OpenMP must not meet torch's."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        print("llama-cpp-python not installed: skipping llama.cpp (make bench installs it)",
              file=sys.stderr)
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(tokens, f)
    child = pathlib.Path(__file__).with_name("llamacpp_run.py")
    command = [sys.executable, str(child), str(gguf), f.name, str(DECODE_PROMPT),
               str(PREFILL_PROMPT), str(NEW_TOKENS), str(REPEATS)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=900)
    crash = None
    if out.returncode != 0:  # its default (extra buffer types) crashed here: say so, fall back
        crash = f"default configuration exited {out.returncode}: {out.stderr.strip()[-300:]}"
        print(f"llama.cpp: {crash}; rerunning with use_extra_bufts=False", file=sys.stderr)
        out = subprocess.run(command + ["--no-extra-bufts"], capture_output=True, text=True,
                             timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"llama.cpp baseline failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"llama.cpp configuration: {result['config']}", file=sys.stderr)
    return {**result, "default_crashed": crash} if crash else result


def bench_llama_server(gguf: pathlib.Path, tokens: list[int]) -> dict | None:
    """Native llama-server (bench/llamacpp_build.sh), timed like the engine behind its socket:
    the same token ids, greedy, streamed, no early stop; and llama-bench's tg and pp on the
    same GGUF and threads, the kernels' ceiling without HTTP."""
    import llamacpp_native

    bin_dir = llamacpp_native.binaries()
    if bin_dir is None:
        print("native llama.cpp not built: skipping llama-server (bash bench/llamacpp_build.sh)",
              file=sys.stderr)
        return None
    ctx = max(2048, DECODE_PROMPT + NEW_TOKENS + 64)
    with llamacpp_native.Server(bin_dir, gguf, threads=2, ctx=ctx) as server:
        server.completion_timed(tokens[:DECODE_PROMPT], 8)  # warm-up
        runs = [server.completion_timed(tokens[:DECODE_PROMPT], NEW_TOKENS)
                for _ in range(REPEATS)]
        prefill = [PREFILL_PROMPT / server.completion_timed(tokens[:PREFILL_PROMPT], 1)[0]
                   for _ in range(REPEATS)]
        config = server.config
    ceiling = llamacpp_native.llama_bench(bin_dir, gguf, 2, PREFILL_PROMPT, NEW_TOKENS)
    return {"decode_tok_s": statistics.median(r[1] for r in runs),
            "prefill_tok_s": statistics.median(prefill),
            "tokens_per_run": [r[2] for r in runs], "version": llamacpp_native.version(bin_dir),
            "config": config, "llama_bench": ceiling}


def configuration(run: dict) -> str:
    """How a llama.cpp baseline ran, in words: its default, or the fallback and why."""
    config = run.get("config", "default")
    return "its default configuration" if config == "default" else config


def bench_transformers(gguf: pathlib.Path, tokens: list[int]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32).eval()

    @torch.inference_mode()
    def decode_once() -> float:
        out = model(torch.tensor([tokens[:DECODE_PROMPT]]), use_cache=True)
        past, tok = out.past_key_values, out.logits[0, -1].argmax().view(1, 1)
        start = time.perf_counter()
        for _ in range(NEW_TOKENS):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[0, -1].argmax().view(1, 1)
        return NEW_TOKENS / (time.perf_counter() - start)

    @torch.inference_mode()
    def prefill_once() -> float:
        start = time.perf_counter()
        model(torch.tensor([tokens[:PREFILL_PROMPT]]))
        return PREFILL_PROMPT / (time.perf_counter() - start)

    decode_once()
    return {"decode_tok_s": statistics.median(decode_once() for _ in range(REPEATS)),
            "prefill_tok_s": statistics.median(prefill_once() for _ in range(REPEATS))}


def prompt_tokens(gguf: pathlib.Path) -> list[int]:
    """The prompt ids: PREFILL_PROMPT of them, or DECODE_PROMPT when --context asks for more
    (the text's ids repeated)."""
    from engined.chat import load_text

    tokenizer, _ = load_text(gguf)
    ids = tokenizer.encode(TEXT, allow_special=False)
    assert len(ids) >= PREFILL_PROMPT, len(ids)
    need = max(PREFILL_PROMPT, DECODE_PROMPT)
    return (ids * (need // len(ids) + 1))[:need]


def main() -> int:
    global DECODE_PROMPT  # --context sets it for every runtime's decode prompt
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip", action="append", default=[],
                        choices=["llamacpp", "llama-server", "transformers"],
                        help="leave a baseline out")
    parser.add_argument("--no-record", action="store_true",
                        help="print the table only: no bench/results JSON, RESULTS.md unchanged")
    parser.add_argument("--context", type=int, default=DECODE_PROMPT, metavar="TOKENS",
                        help=f"decode after a prompt this long (default {DECODE_PROMPT}; e.g. 4000 "
                             f"for an agent-sized context); results go to decode_context-*.json")
    args = parser.parse_args()
    if not 1 <= args.context <= 8000:
        parser.error("--context must be 1..8000 (the engine serves --max-context 8192)")
    is_long, DECODE_PROMPT = args.context != DECODE_PROMPT, args.context
    gguf = default_gguf_path()
    tokens = prompt_tokens(gguf)
    command = " ".join(["bench/decode.py", *sys.argv[1:]])
    results = {"hardware": hardware(), "command": command, "engine": bench_engine(gguf, tokens),
               "engine_speculative": bench_engine(gguf, tokens, "on")}
    if "llamacpp" not in args.skip:
        results["llamacpp"] = bench_llamacpp(gguf, tokens)
    if "llama-server" not in args.skip:
        results["llama-server"] = bench_llama_server(gguf, tokens)
    if "transformers" not in args.skip:
        results["transformers"] = bench_transformers(gguf, tokens)
    rows = ["| runtime | decode tok/s | prefill tok/s | decode vs llama-server | prefill vs llama-server |",
            "|---|---:|---:|---:|---:|"]
    ref = results.get("llama-server")
    labels = {"engine": "engine, speculation off", "engine_speculative": "engine, speculation on (default)"}
    for name in ("engine", "engine_speculative", "llama-server", "llamacpp", "transformers"):
        r = results.get(name)
        if not r:
            continue
        ratio = (lambda k: f"{r[k] / ref[k]:.2f}x" if ref else "n/a")
        rows.append(f"| {labels.get(name, name)} | {r['decode_tok_s']:.1f} | {r['prefill_tok_s']:.1f} | "
                    f"{ratio('decode_tok_s')} | {ratio('prefill_tok_s')} |")
    e = results["engine"]
    if ref:
        bench = ref["llama_bench"]
        rows.append(f"\nServed against served: the engine over its socket, native llama-server "
                    f"({ref['version']}, {configuration(ref)}) over loopback HTTP, the same "
                    f"token ids, both streaming. llama-bench on the same GGUF and threads, no "
                    f"HTTP: tg{NEW_TOKENS} {bench['tg_tok_s']:.1f} tok/s, pp{PREFILL_PROMPT} "
                    f"{bench['pp_tok_s']:.1f} tok/s (the kernels' ceiling; {configuration(bench)}).")
    if results.get("llamacpp"):
        rows.append("\nllamacpp: llama-cpp-python's in-process binding "
                    f"({results['llamacpp']['config']}), for comparison with earlier runs.")
    rows.append(f"\nEngine peak RSS at --max-context 8192: {e['peak_rss_mb']:.0f} MB "
                f"({e['rss_above_import_mb']:.0f} MB above the post-import baseline).")
    print("\n".join(rows))
    if args.no_record:
        return 0
    results.update(context=DECODE_PROMPT, new_tokens=NEW_TOKENS, prefill_tokens=PREFILL_PROMPT)
    path = record("decode_context" if is_long else "decode", results,
                  "Decode and prefill, SmolLM2-135M-Instruct Q4_1 GGUF, 2 threads"
                  + (f", decode after a {DECODE_PROMPT}-token prompt" if is_long else ""),
                  command, rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
