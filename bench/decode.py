"""make bench: decode and prefill speed of kimi-engine on the default model, beside llama.cpp
(llama-cpp-python) and HF transformers (fp32) on the same GGUF, same machine, same run.

Decode: 64 new tokens, greedy, 17-token prompt, 5 repeats after a warm-up, median tok/s.
Prefill: a 512-token prompt, tok/s = 512 / time to first token, with the engine's prefix
cache off (the repeats send the same prompt). Threads: 2 for everyone.
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
from common import append_results, hardware, stream_text_times, write_json  # noqa: E402

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


def bench_engine(gguf: pathlib.Path, tokens: list[int]) -> dict:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kimi-bench-"))
    sock = str(tmp / "engine.sock")
    env = dict(os.environ, XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(tmp / "cache")))
    baseline = subprocess.run([sys.executable, "-c", "import engined.serving.routes, engined.weights.loader, torch;"
                               "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"],
                              capture_output=True, text=True, env=env)
    proc = subprocess.Popen([str(pathlib.Path(sys.executable).parent / "kimi-engine"), "serve",
                             "--model", "default", "--socket", sock, "--threads", "2",
                             "--max-context", "8192",
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
                   for _ in range(3)]
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
            "prefill_tok_s": statistics.median(prefill_once() for _ in range(3))}


def prompt_tokens(gguf: pathlib.Path) -> list[int]:
    from engined.chat import load_text

    tokenizer, _ = load_text(gguf)
    ids = tokenizer.encode(TEXT, allow_special=False)
    assert len(ids) >= PREFILL_PROMPT, len(ids)
    return ids[:PREFILL_PROMPT]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip", action="append", default=[],
                        choices=["llamacpp", "transformers"], help="leave a baseline out")
    args = parser.parse_args()
    gguf = default_gguf_path()
    tokens = prompt_tokens(gguf)
    command = " ".join(["bench/decode.py", *sys.argv[1:]])
    results = {"hardware": hardware(), "command": command, "engine": bench_engine(gguf, tokens)}
    if "llamacpp" not in args.skip:
        results["llamacpp"] = bench_llamacpp(gguf, tokens)
    if "transformers" not in args.skip:
        results["transformers"] = bench_transformers(gguf, tokens)
    rows = ["| runtime | decode tok/s | prefill tok/s | decode vs llama.cpp | prefill vs llama.cpp |",
            "|---|---:|---:|---:|---:|"]
    ref = results.get("llamacpp")
    for name in ("engine", "llamacpp", "transformers"):
        r = results.get(name)
        if not r:
            continue
        ratio = (lambda k: f"{r[k] / ref[k]:.2f}x" if ref else "n/a")
        rows.append(f"| {name} | {r['decode_tok_s']:.1f} | {r['prefill_tok_s']:.1f} | "
                    f"{ratio('decode_tok_s')} | {ratio('prefill_tok_s')} |")
    if ref:
        rows.append(f"\nllama.cpp configuration: {ref['config']}"
                    + (f" (its default crashed: {ref['default_crashed']})"
                       if ref.get("default_crashed") else " (its default, fastest one)"))
    e = results["engine"]
    rows.append(f"\nEngine peak RSS at --max-context 8192: {e['peak_rss_mb']:.0f} MB "
                f"({e['rss_above_import_mb']:.0f} MB above the post-import baseline).")
    print("\n".join(rows))
    print(f"wrote {write_json('decode', results)}")
    append_results("Decode and prefill, SmolLM2-135M-Instruct Q4_1 GGUF, 2 threads",
                   command, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
