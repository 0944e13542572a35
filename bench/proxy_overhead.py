"""Proxy overhead over real loopback sockets (a script, not a test).

    .venv/bin/python bench/proxy_overhead.py [--requests 600] [--clients 64] [--seconds 10]
        [--runs 3] [--baseline-tree /tmp/wt-OLD ...] [--note-file profile.txt]

Starts a fast fake OpenAI-Chat upstream (gevent WSGI, its own process) and `kimi-proxy
serve` (its own process) in front of it. Then, interleaved and over keep-alive
connections, it times the same chat request direct to the upstream and through the
proxy (Chat passthrough and Anthropic translation): non-stream total time and stream
time to first byte. Added latency = proxied minus direct, same run. Finally 64
concurrent keep-alive clients hammer the proxy for throughput. Every number printed goes
to bench/results/proxy_overhead-DATE[-N].json (never overwriting an earlier run; `make figures`
draws it), with the hardware, command, date, commit and this table, and bench/RESULTS.md is
regenerated from it.

--baseline-tree PATH (a `git worktree add PATH COMMIT`; repeatable) starts another proxy
from that tree, with this venv, in front of the same upstream; the proxies take turns in
blocks of 20 requests (each after a direct one), their order alternating, so all see the
same moments of a shared machine. --runs N repeats the measurement and reports each
number's median over the runs (per-run added p50s in the JSON). --note-file adds its
lines (a profile, a session note) to the record.
"""
import argparse
import asyncio
import datetime
import http.client
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from common import record  # noqa: E402

CHAT = {"model": "k", "max_tokens": 16, "messages": [{"role": "user", "content": "ping"}]}
ANTHROPIC = {"model": "k", "max_tokens": 16, "messages": [{"role": "user", "content": "ping"}]}


def serve_upstream(port: int) -> None:
    """The fake engine: a fixed completion, or 4 SSE chunks, with no think time."""
    from gevent import monkey
    monkey.patch_all()
    from gevent.pywsgi import WSGIServer
    base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0, "model": "k"}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
              for w in ("po", "ng", "!")]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
    stream_body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    json_body = json.dumps({"id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": "k",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong!"},
                                         "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}).encode()

    def app(environ, start_response):
        body = json.loads(environ["wsgi.input"].read() or b"{}")
        if body.get("stream"):
            start_response("200 OK", [("Content-Type", "text/event-stream")])
            return [stream_body]
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(json_body)))])
        return [json_body]

    class NoDelay(WSGIServer):
        def handle(self, sock, address):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return super().handle(sock, address)

    NoDelay(("127.0.0.1", port), app, log=None).serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port}")


class Client:
    """One keep-alive connection; times a request to its first body byte and to its end."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def time(self, path: str, body: dict, headers: dict | None = None) -> tuple[float, float]:
        raw = json.dumps(body).encode()
        start = time.perf_counter()
        self.conn.request("POST", path, raw, {"Content-Type": "application/json", **(headers or {})})
        resp = self.conn.getresponse()
        first = resp.read1(1)
        ttfb = time.perf_counter() - start
        resp.read()
        total = time.perf_counter() - start
        if resp.status != 200 or not first:
            raise SystemExit(f"{path} answered {resp.status}")
        return ttfb, total


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


CASES = [("chat non-stream", "/v1/chat/completions", CHAT, {}, 1),
         ("chat stream TTFB", "/v1/chat/completions", {**CHAT, "stream": True}, {}, 0),
         ("anthropic non-stream", "/v1/messages", ANTHROPIC, {"anthropic-version": "2023-06-01"}, 1),
         ("anthropic stream TTFB", "/v1/messages", {**ANTHROPIC, "stream": True},
          {"anthropic-version": "2023-06-01"}, 0)]


BLOCK = 20  # requests in a row to one proxy before the next proxy's turn


def latency(up_port: int, proxy_ports: list[int], n: int) -> list[list[tuple]]:
    """Per proxy, a row per case: (case, direct p50, proxied p50, added p50, added p99) in ms.
    Each proxied request follows a direct one. Proxies take turns in blocks of BLOCK requests,
    their order alternating: a proxy woken once per request of every other proxy reads
    slower on this host (direct p50 0.23 -> 0.40 ms with three), so turns are blocks."""
    direct, proxies = Client(up_port), [Client(port) for port in proxy_ports]
    rows = [[] for _ in proxies]
    for name, path, body, headers, which in CASES:
        upstream_body = {**CHAT, "stream": body.get("stream", False)}
        for _ in range(20):  # warm-up
            direct.time("/v1/chat/completions", upstream_body)
            for proxied in proxies:
                proxied.time(path, body, headers)
        d, p = [[] for _ in proxies], [[] for _ in proxies]
        for block, start in enumerate(range(0, n, BLOCK)):
            for k in (range(len(proxies)) if block % 2 == 0 else reversed(range(len(proxies)))):
                for _ in range(min(BLOCK, n - start)):
                    d[k].append(direct.time("/v1/chat/completions", upstream_body)[which])
                    p[k].append(proxies[k].time(path, body, headers)[which])
        for k, samples in enumerate(p):
            added = [b - a for a, b in zip(d[k], samples)]
            rows[k].append((name, pct(d[k], 50), pct(samples, 50), pct(samples, 50) - pct(d[k], 50), pct(added, 99)))
    return rows


def median_rows(runs: list[list[tuple]]) -> list[tuple]:
    """Each number's median over the runs (so added p50 need not be proxied minus direct)."""
    return [(cases[0][0], *(statistics.median(col) for col in list(zip(*cases))[1:])) for cases in zip(*runs)]


async def _worker(port: int, path: str, body: bytes, stop_at: float, counts: list) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    while time.monotonic() < stop_at:
        writer.write(head)
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        counts[0 if status.split()[1] == b"200" else 1] += 1
    writer.close()


def throughput(port: int, clients: int, seconds: float) -> tuple[float, int]:
    counts = [0, 0]
    body = json.dumps(CHAT).encode()

    async def main():
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*[_worker(port, "/v1/chat/completions", body, stop_at, counts)
                               for _ in range(clients)])
    start = time.monotonic()
    asyncio.run(main())
    return counts[0] / (time.monotonic() - start), counts[1]


def report(args, rows, rps, errors, baselines=()) -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    lines = [f"\n## Proxy overhead ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)\n",
             f"- Hardware: {cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}; loopback TCP, "
             "keep-alive, TCP_NODELAY; proxy = `kimi-proxy serve` (gevent), upstream = gevent fake engine.",
             f"- Command: `.venv/bin/python bench/proxy_overhead.py --requests {args.requests} "
             f"--clients {args.clients} --seconds {args.seconds}{extra_args(args)}`",
             f"- {args.requests} interleaved requests per path after 20 warm-up each{runs_text(args)}; "
             f"1-minute load average "
             f"at the end {os.getloadavg()[0]:.2f} (other jobs share this host).",
             "- Goals (issue #3): added p50 <= 0.5 ms; >= 1,000 req/s at 64 clients with 0 errors. "
             "The public k3 proxy adds 3.1 ms p50 in such a harness.\n",
             "| case | direct p50 ms | proxied p50 ms | added p50 ms | added p99 ms |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {d:.3f} | {p:.3f} | {a:.3f} | {a99:.3f} |" for n, d, p, a, a99 in rows]
    lines.append(f"\nThroughput, {args.clients} concurrent keep-alive clients, chat non-stream through the proxy: "
                 f"**{rps:.0f} req/s**, {errors} errors ({args.seconds:.0f} s).\n")
    for baseline in baselines:
        lines += baseline_lines(rows, baseline)
    if args.note_file:
        lines += ["", *pathlib.Path(args.note_file).read_text().rstrip("\n").split("\n")]
    return "\n".join(lines)


def extra_args(args) -> str:
    return ((f" --runs {args.runs}" if args.runs != 1 else "")
            + "".join(f" --baseline-tree {tree}" for tree in args.baseline_tree))


def runs_text(args) -> str:
    return f", {args.runs} runs, each number the median of the runs" if args.runs > 1 else ""


def baseline_lines(rows, baseline: dict) -> list[str]:
    lines = [f"Baseline in the same run: the proxy of commit {baseline['commit']} ({baseline['tree']}), "
             "requests interleaved with this tree's.\n",
             f"| case | added p50 ms, this tree | added p50 ms, {baseline['commit']} | change ms |",
             "|---|---|---|---|"]
    lines += [f"| {r[0]} | {r[3]:.3f} | {b[3]:.3f} | {r[3] - b[3]:+.3f} |" for r, b in zip(rows, baseline["rows"])]
    lines.append(f"\nThroughput of {baseline['commit']}, measured after this tree's: **{baseline['req_s']:.0f} req/s**, "
                 f"{baseline['errors']} errors.\n")
    return lines


def tree_commit(tree: pathlib.Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def start_proxy(tree: pathlib.Path, up_port: int, port: int) -> subprocess.Popen:
    """`kimi-proxy serve` from a source tree (its proxy package, this venv)."""
    env = {**os.environ, "XDG_STATE_HOME": os.environ.get("TMPDIR", "/tmp") + f"/kimi-bench-{os.getpid()}-{port}",
           "PYTHONPATH": str(tree)}
    return subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream",
                             f"http://127.0.0.1:{up_port}/v1", "--model", "k"], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true",
                    help="print only: no bench/results JSON, bench/RESULTS.md unchanged")
    ap.add_argument("--runs", type=int, default=1, help="repeat the latency measurement; report medians")
    ap.add_argument("--baseline-tree", type=pathlib.Path, action="append", default=[],
                    help="a source tree (git worktree) whose proxy is measured interleaved with this one")
    ap.add_argument("--note-file", help="lines to add to the record (a profile, a session note)")
    args = ap.parse_args()
    if args.serve_upstream:
        return serve_upstream(args.serve_upstream)
    trees = [ROOT] + [tree.resolve() for tree in args.baseline_tree]
    up_port, ports = free_port(), [free_port() for _ in trees]
    procs = [subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)])]
    procs += [start_proxy(tree, up_port, port) for tree, port in zip(trees, ports)]
    try:
        for port in [up_port, *ports]:
            wait_port(port)
        runs = [latency(up_port, ports, args.requests) for _ in range(args.runs)]
        done = [throughput(port, args.clients, args.seconds) for port in ports]
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    rows, (rps, errors) = median_rows([run[0] for run in runs]), done[0]
    baselines = [{"tree": str(tree), "commit": tree_commit(tree), "rows": median_rows([run[k] for run in runs]),
                  "req_s": done[k][0], "errors": done[k][1],
                  "runs_added_p50_ms": {r[0]: [run[k][i][3] for run in runs] for i, r in enumerate(rows)}}
                 for k, tree in enumerate(args.baseline_tree, start=1)]
    text = report(args, rows, rps, errors, baselines)
    print(text)
    if not args.no_write:
        write(args, rows, rps, errors, baselines, runs, text)


def write(args, rows, rps, errors, baselines, runs, text) -> None:
    command = " ".join(["bench/proxy_overhead.py", *sys.argv[1:]])
    columns = ("case", "direct_p50_ms", "proxied_p50_ms", "added_p50_ms", "added_p99_ms")
    payload = {"command": command, "python": platform.python_version(), "requests": args.requests,
               "loadavg_1min": os.getloadavg()[0], "rows": [dict(zip(columns, r)) for r in rows],
               "throughput": {"clients": args.clients, "seconds": args.seconds, "req_s": rps, "errors": errors}}
    if args.runs > 1:
        payload["runs_added_p50_ms"] = {r[0]: [run[0][i][3] for run in runs] for i, r in enumerate(rows)}
    if baselines:
        payload["baselines"] = [{**b, "rows": [dict(zip(columns, r)) for r in b["rows"]]} for b in baselines]
    title, *lines = text.strip("\n").split("\n")
    print("wrote", record("proxy_overhead", payload, title.removeprefix("## "), command, lines))


if __name__ == "__main__":
    main()
