"""Proxy overhead over real loopback sockets (a script, not a test).

    .venv/bin/python bench/proxy_overhead.py [--requests 600] [--clients 64] [--seconds 10]

Starts a fast fake OpenAI-Chat upstream (gevent WSGI, its own process) and `kimi-proxy
serve` (its own process) in front of it. Then, interleaved and over keep-alive
connections, it times the same chat request direct to the upstream and through the
proxy (Chat passthrough and Anthropic translation): non-stream total time and stream
time to first byte. Added latency = proxied minus direct, same run. Finally 64
concurrent keep-alive clients hammer the proxy for throughput. Every number printed goes
to bench/results/proxy_overhead-DATE[-N].json (never overwriting an earlier run; `make figures`
draws it), with the hardware, command, date, commit and this table, and bench/RESULTS.md is
regenerated from it.
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


def latency(up_port: int, proxy_port: int, n: int) -> list[tuple[str, float, float, float, float]]:
    direct, proxied = Client(up_port), Client(proxy_port)
    cases = [("chat non-stream", "/v1/chat/completions", CHAT, {}, 1),
             ("chat stream TTFB", "/v1/chat/completions", {**CHAT, "stream": True}, {}, 0),
             ("anthropic non-stream", "/v1/messages", ANTHROPIC, {"anthropic-version": "2023-06-01"}, 1),
             ("anthropic stream TTFB", "/v1/messages", {**ANTHROPIC, "stream": True},
              {"anthropic-version": "2023-06-01"}, 0)]
    rows = []
    for name, path, body, headers, which in cases:
        upstream_body = {**CHAT, "stream": body.get("stream", False)}
        for _ in range(20):  # warm-up
            direct.time("/v1/chat/completions", upstream_body)
            proxied.time(path, body, headers)
        d, p = [], []
        for _ in range(n):
            d.append(direct.time("/v1/chat/completions", upstream_body)[which])
            p.append(proxied.time(path, body, headers)[which])
        added = [b - a for a, b in zip(d, p)]
        rows.append((name, pct(d, 50), pct(p, 50), pct(p, 50) - pct(d, 50), pct(added, 99)))
    return rows


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


def report(args, rows, rps, errors) -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    lines = [f"\n## Proxy overhead ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)\n",
             f"- Hardware: {cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}; loopback TCP, "
             "keep-alive, TCP_NODELAY; proxy = `kimi-proxy serve` (gevent), upstream = gevent fake engine.",
             f"- Command: `.venv/bin/python bench/proxy_overhead.py --requests {args.requests} "
             f"--clients {args.clients} --seconds {args.seconds}`",
             f"- {args.requests} interleaved requests per path after 20 warm-up each; 1-minute load average "
             f"at the end {os.getloadavg()[0]:.2f} (other jobs share this host).",
             "- Goals (issue #3): added p50 <= 0.5 ms; >= 1,000 req/s at 64 clients with 0 errors. "
             "The public k3 proxy adds 3.1 ms p50 in such a harness.\n",
             "| case | direct p50 ms | proxied p50 ms | added p50 ms | added p99 ms |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {d:.3f} | {p:.3f} | {a:.3f} | {a99:.3f} |" for n, d, p, a, a99 in rows]
    lines.append(f"\nThroughput, {args.clients} concurrent keep-alive clients, chat non-stream through the proxy: "
                 f"**{rps:.0f} req/s**, {errors} errors ({args.seconds:.0f} s).\n")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true",
                    help="print only: no bench/results JSON, bench/RESULTS.md unchanged")
    args = ap.parse_args()
    if args.serve_upstream:
        return serve_upstream(args.serve_upstream)
    up_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "XDG_STATE_HOME": os.environ.get("TMPDIR", "/tmp") + f"/kimi-bench-{os.getpid()}"}
    procs = [subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)]),
             subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(proxy_port), "--upstream",
                               f"http://127.0.0.1:{up_port}/v1", "--model", "k"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_port(up_port)
        wait_port(proxy_port)
        rows = latency(up_port, proxy_port, args.requests)
        rps, errors = throughput(proxy_port, args.clients, args.seconds)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    text = report(args, rows, rps, errors)
    print(text)
    if not args.no_write:
        command = " ".join(["bench/proxy_overhead.py", *sys.argv[1:]])
        columns = ("case", "direct_p50_ms", "proxied_p50_ms", "added_p50_ms", "added_p99_ms")
        title, *lines = text.strip("\n").split("\n")
        print("wrote", record("proxy_overhead", {
            "command": command, "python": platform.python_version(), "requests": args.requests,
            "loadavg_1min": os.getloadavg()[0], "rows": [dict(zip(columns, r)) for r in rows],
            "throughput": {"clients": args.clients, "seconds": args.seconds, "req_s": rps,
                           "errors": errors}}, title.removeprefix("## "), command, lines))


if __name__ == "__main__":
    main()
