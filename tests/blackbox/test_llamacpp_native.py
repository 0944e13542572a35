"""The native llama.cpp baseline's plumbing, without building it: the build is found in a
cache keyed by the CPU's flags, and llama-server's streams (its /completion and its chat
route) are read into token counts and times as the benchmarks need."""
import hashlib
import os
import subprocess

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
    first, last, count = native().Server._read(Stream(lines))
    assert count == 64 and last >= first


def test_chat_stream_counts_content_deltas_without_timings():
    lines = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n',
             b'data: {"choices":[{"index":0,"delta":{"content":"def"}}]}\n',
             b'data: {"choices":[{"index":0,"delta":{"content":" f"}}]}\n',
             b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n',
             b"data: [DONE]\n"]
    first, last, count = native().Server._read(Stream(lines))
    assert count == 2 and last >= first
