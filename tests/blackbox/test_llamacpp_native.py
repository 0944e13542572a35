"""The native llama.cpp baseline's plumbing, without building it: the build is found in a
cache keyed by the CPU's flags, llama-server's streams (its /completion and its chat route)
are read into token counts and times as the benchmarks need, and a default configuration
that dies on a signal falls back to repacking off and says so, while a server that fails
otherwise is reported with its log."""
import hashlib
import os
import subprocess

import pytest

from tests.blackbox.service_helpers import ROOT
from tests.support import bench

BENCH = ROOT / "bench"


def native():
    return bench.load("llamacpp_native")


def cpu_key() -> str:
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    words = sorted(flags.split(":", 1)[1].split())
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:12]


def test_a_build_cached_for_this_cpu_is_used_and_another_cpus_is_not(tmp_path):
    for key in (cpu_key(), "0123456789ab"):
        (tmp_path / f"0.3.36-{key}" / "bin").mkdir(parents=True)
        for name in ("llama-server", "llama-bench"):
            path = tmp_path / f"0.3.36-{key}" / "bin" / name
            path.write_text("#!/bin/sh\n")
            path.chmod(0o755)
    out = subprocess.run(["bash", str(BENCH / "llamacpp_build.sh")], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, KIMI_LLAMACPP_CACHE=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / f"0.3.36-{cpu_key()}" / "bin")


class Stream:
    def __init__(self, lines: list[bytes]):
        self.status, self.lines = 200, lines

    def __iter__(self):
        return iter(self.lines)


def test_completion_stream_counts_the_servers_predicted_tokens():
    lines = [b'data: {"index":0,"content":"Hello","tokens":[9906],"stop":false}\n', b"\n",
             b'data: {"index":0,"content":" world","tokens":[1917],"stop":false}\n',
             b'data: {"index":0,"content":"","stop":true,"timings":{"prompt_n":17,'
             b'"predicted_n":64,"predicted_per_second":90.5}}\n']
    first, last, count, timings = native().Server._read(Stream(lines))
    assert count == 64 and last >= first and timings["prompt_n"] == 17


def test_chat_stream_counts_content_deltas_without_timings():
    lines = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n',
             b'data: {"choices":[{"index":0,"delta":{"content":"def"}}]}\n',
             b'data: {"choices":[{"index":0,"delta":{"content":" f"}}]}\n',
             b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n',
             b"data: [DONE]\n"]
    first, last, count, timings = native().Server._read(Stream(lines))
    assert count == 2 and last >= first and timings == {}


# Stand-ins for the two binaries: each dies of SIGILL in its default configuration (as
# llama.cpp's AMX path does on a Xeon here) and runs with repacking off. The server answers
# /health on the --port it is given; the bench prints llama-bench's JSON.
FAKE_SERVER = """#!/usr/bin/env python3
import http.server, os, signal, sys
args = sys.argv[1:]
print("fake llama-server", " ".join(args), flush=True)
if "--no-repack" not in args and "--exit-1" not in args and "--hang" not in args:
    os.kill(os.getpid(), signal.SIGILL)
if "--exit-1" in args:
    print("error: model not found", flush=True)
    sys.exit(1)
if "--hang" in args:
    print("loading slowly", flush=True)
    signal.pause()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
port = int(args[args.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
FAKE_BENCH = """#!/usr/bin/env python3
import json, os, signal, sys
if "--repack" not in sys.argv:
    os.kill(os.getpid(), signal.SIGILL)
print(json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 500.0},
                  {"n_prompt": 0, "n_gen": 64, "avg_ts": 100.0}]))
"""


def fake_binaries(tmp_path):
    for name, text in (("llama-server", FAKE_SERVER), ("llama-bench", FAKE_BENCH)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    return tmp_path


def test_a_server_whose_default_dies_on_a_signal_runs_without_repacking_and_says_so(tmp_path):
    bin_dir = fake_binaries(tmp_path)
    with native().Server(bin_dir, tmp_path / "m.gguf", threads=2, ctx=2048) as server:
        conn = native().http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        assert server.config.startswith("--no-repack: its default died on signal 4")
        assert "--no-repack" in server.proc.args


def test_a_server_that_exits_with_an_error_is_reported_with_its_log(tmp_path):
    """An exit status is llama-server's own answer (a bad model, say): no second try, and
    the error carries what it printed."""
    server = native().Server(fake_binaries(tmp_path), tmp_path / "m.gguf", threads=2, ctx=2048,
                             extra=("--exit-1",))
    with pytest.raises(RuntimeError, match=r"(?s)exit status 1, default\).*error: model not found"):
        server.__enter__()


def test_a_server_that_never_answers_is_reported_not_restarted(tmp_path, monkeypatch):
    """Stopped at the deadline, it dies of our SIGTERM: that is no crash of its default."""
    monkeypatch.setattr(native().Server, "START_S", 1)
    server = native().Server(fake_binaries(tmp_path), tmp_path / "m.gguf", threads=2, ctx=2048,
                             extra=("--hang",))
    with pytest.raises(RuntimeError, match=r"(?s)no health in 1 s, default\).*loading slowly"):
        server.__enter__()


def test_llama_bench_whose_default_dies_on_a_signal_runs_without_repacking(tmp_path):
    result = native().llama_bench(fake_binaries(tmp_path), tmp_path / "m.gguf", 2, 512, 64)
    assert result == {"config": "--repack 0: its default died on signal 4", "pp_tok_s": 500.0,
                      "tg_tok_s": 100.0}
