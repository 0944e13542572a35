"""Agent turns and concurrent streams against the real kimi-engine daemon (default model).

1. TTFT per turn of a recorded Cline session (tests/fixtures/live-clients/cline-tool.jsonl.gz:
   turns 1-2 as captured, turns 3-4 extend turn 2 with a fixed assistant reply and user
   follow-up), with the prefix cache on (default 256MiB) and off (--prefix-cache-bytes 0).
   TTFT = latency of a non-streamed chat request with max_tokens 1 (prefill + one token).
2. Aggregate decode tok/s at 1, 2, 4 and 8 concurrent streams (64 tokens each, ignore_eos),
   beside the same 4 streams with --max-batch 1 (one at a time: the baseline).
"""
import argparse
import copy
import gzip
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import hardware, record, stream_text_times, unix_metrics, unix_post  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "tests" / "fixtures" / "live-clients" / "cline-tool.jsonl.gz"
FOLLOW_UPS = ["Good. Now list the files in the current directory and say what each one is for.",
              "Thanks. Summarise what we did so far in two sentences."]
NEW_TOKENS, STREAMS = 64, (1, 2, 4, 8)
TEXT = ("The history of computing is a story of ideas that became machines and machines that "
        "changed ideas. Early calculators, punched cards and vacuum tubes gave way to ") * 8


def session_turns() -> list[dict]:
    """Chat bodies of turns 1..4; each turn's prompt starts with the previous one's."""
    captured = [json.loads(line)["body"] for line in gzip.open(CAPTURE)]
    turns = [copy.deepcopy(b) for b in captured]
    messages = turns[-1]["messages"]
    for follow_up in FOLLOW_UPS:
        messages = messages + [{"role": "assistant", "content": "Done: the command printed "
                                "tool-ran-ok."}, {"role": "user", "content": follow_up}]
        turns.append({**copy.deepcopy(turns[-1]), "messages": messages})
    for body in turns:
        body.update(stream=False, max_tokens=1, temperature=0)
    return turns


class Daemon:
    def __init__(self, *args: str):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="kimi-bench-"))
        self.sock = str(self.dir / "engine.sock")
        env = dict(os.environ, XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME",
                                                             str(self.dir / "cache")))
        self.proc = subprocess.Popen(
            [str(pathlib.Path(sys.executable).parent / "kimi-engine"), "serve", "--socket",
             self.sock, "--threads", "2", "--max-context", "8192", *args],
            env=env, stderr=subprocess.DEVNULL)
        deadline = time.time() + 900
        while not os.path.exists(self.sock):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"kimi-engine {' '.join(args)} did not start")
            time.sleep(0.2)
        time.sleep(0.5)

    def post(self, path: str, body: dict) -> dict:
        conn, resp = unix_post(self.sock, path, body)
        data = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {data[:300]!r}")
        return json.loads(data)

    def metric(self, name: str) -> float:
        return unix_metrics(self.sock).get(name, 0.0)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def turn_ttfts(daemon: Daemon) -> list[dict]:
    rows = []
    for number, body in enumerate(session_turns(), 1):
        hits = daemon.metric("kimi_engine_prefix_cache_hit_tokens_total")
        start = time.perf_counter()
        reply = daemon.post("/v1/chat/completions", body)
        rows.append({"turn": number, "ttft_s": time.perf_counter() - start,
                     "prompt_tokens": reply["usage"]["prompt_tokens"],
                     "hit_tokens": daemon.metric("kimi_engine_prefix_cache_hit_tokens_total") - hits})
    return rows


def one_stream(daemon: Daemon, prompt: str, out: list):
    out.append(stream_text_times(daemon.sock, prompt, NEW_TOKENS))


def aggregate_decode(daemon: Daemon, num_streams: int) -> float:
    """Tokens after each stream's first / (last token of any - first token of any)."""
    results, threads = [], []
    for i in range(num_streams):
        prompt = f"Stream {i}: " + TEXT[i * 37:]
        threads.append(threading.Thread(target=one_stream, args=(daemon, prompt, results)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tokens = sum(count - 1 for _, _, count in results)
    return tokens / (max(r[1] for r in results) - min(r[0] for r in results))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    results = {"hardware": hardware()}
    for mode, flags in (("cache off", ("--prefix-cache-bytes", "0")), ("cache on", ())):
        daemon = Daemon(*flags)
        try:
            daemon.post("/v1/completions", {"prompt": "warm up", "max_tokens": 2})
            results[mode] = turn_ttfts(daemon)
            if mode == "cache on":
                aggregate_decode(daemon, 2)  # warm-up
                results["decode"] = {n: aggregate_decode(daemon, n) for n in STREAMS}
        finally:
            daemon.stop()
    daemon = Daemon("--max-batch", "1")
    try:
        aggregate_decode(daemon, 1)
        results["decode_max_batch_1"] = {4: aggregate_decode(daemon, 4)}
    finally:
        daemon.stop()
    lines = report(results)
    print("\n".join(lines))
    if not args.no_record:
        record("agent_turns", results, "Agent turns (prefix cache) and concurrent decode "
               "(batching), default model", "python bench/agent_turns.py", lines)


def report(results: dict) -> list[str]:
    off, on = results["cache off"], results["cache on"]
    lines = ["| turn | prompt tokens | TTFT cache off s | TTFT cache on s | hit tokens | speed-up |",
             "|---:|---:|---:|---:|---:|---:|"]
    for a, b in zip(off, on):
        lines.append(f"| {a['turn']} | {a['prompt_tokens']} | {a['ttft_s']:.2f} | "
                     f"{b['ttft_s']:.2f} | {int(b['hit_tokens'])} | {a['ttft_s'] / b['ttft_s']:.1f}x |")
    worst = max(t["ttft_s"] for t in on[1:]) / on[0]["ttft_s"]
    lines += ["", f"Turn-N TTFT / turn-1 TTFT with the cache (goal <= 1.5): worst {worst:.2f}.", "",
              "| streams | aggregate decode tok/s | vs 1 stream |", "|---:|---:|---:|"]
    single = results["decode"][1]
    for n, rate in results["decode"].items():
        lines.append(f"| {n} | {rate:.1f} | {rate / single:.2f}x |")
    base = results["decode_max_batch_1"][4]
    lines += ["", f"Baseline, same run: 4 streams with --max-batch 1 (one at a time): "
                  f"{base:.1f} tok/s ({base / single:.2f}x). Goal at 4 streams: >= 2.5x one "
                  f"stream. Turns 3-4 extend the captured session with fixed text."]
    return lines


if __name__ == "__main__":
    main()
