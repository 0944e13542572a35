"""Native llama.cpp for the benchmarks: `llama-server` over loopback HTTP, served against our
served engine, and `llama-bench` as the kernel ceiling (bench/llamacpp_build.sh builds both,
cached by the CPU's flags). Run in llama.cpp's own default configuration; only the model,
threads, context and port are given.
"""
import http.client
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

BUILD = pathlib.Path(__file__).resolve().with_name("llamacpp_build.sh")


def binaries(build: bool = True) -> pathlib.Path | None:
    """The folder holding llama-server and llama-bench: $KIMI_LLAMACPP_BIN, else the cached
    build for this CPU (built now when `build`), else None."""
    if os.environ.get("KIMI_LLAMACPP_BIN"):
        return pathlib.Path(os.environ["KIMI_LLAMACPP_BIN"])
    if not build:
        return None
    out = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"llama.cpp build failed:\n{out.stderr[-2000:]}")
        return None
    return pathlib.Path(out.stdout.strip().splitlines()[-1])


def version(bin_dir: pathlib.Path) -> str:
    """llama.cpp's own build line (`llama-server --version`: version and commit)."""
    out = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True,
                         text=True, timeout=60)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "version" in line]
    return lines[0].strip() if lines else "unknown"


def _post(port: int, path: str, body: dict):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    return conn, conn.getresponse()


# llama.cpp's weights repacked into its extra buffer types (CPU_REPACK; AMX on a Xeon that has
# it) are its default. On a 2-core Xeon with AMX (Sapphire Rapids' successor, in a VM) that path
# dies at its first matrix multiply: SIGILL at tilezero in an OpenMP thread (llama-bench under
# gdb). There the benchmarks take the fastest configuration that runs, repacking off, and say so.
NO_REPACK_SERVER, NO_REPACK_BENCH = ("--no-repack",), ("--repack", "0")


def _killed(returncode: int | None) -> bool:
    """A process that died on a signal (SIGILL, SIGSEGV), not one that exited with an error."""
    return returncode is not None and returncode < 0


class Server:
    """with Server(bin_dir, gguf, threads=2, ctx=4096, extra=(...)) as server: server.port.
    server.config says what ran: "default", or the fallback and why (NO_REPACK_SERVER)."""

    START_S = 120  # for /health to answer 200

    def __init__(self, bin_dir: pathlib.Path, gguf: pathlib.Path, threads: int, ctx: int,
                 extra: tuple[str, ...] = ()):
        self.command = [str(bin_dir / "llama-server"), "-m", str(gguf), "-t", str(threads),
                        "-tb", str(threads), "-c", str(ctx), "--host", "127.0.0.1", *extra]
        self.config = "default"
        self._start(())

    def _start(self, fallback: tuple[str, ...]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log")
        self.proc = subprocess.Popen([*self.command, "--port", str(self.port), *fallback],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "Server":
        deadline = time.time() + self.START_S
        while True:
            exited = self.proc.poll()  # None while it runs: a server still starting at the deadline
            if exited is not None or time.time() > deadline:
                self.log.seek(0)
                said = self.log.read()[-2000:]  # before __exit__ closes the log
                self.__exit__()
                if _killed(exited) and self.config == "default":
                    self.config = (f"{' '.join(NO_REPACK_SERVER)}: its default died on signal "
                                   f"{-exited} before it served")
                    print(f"llama-server: {self.config}; starting it again so", file=sys.stderr)
                    self._start(NO_REPACK_SERVER)
                    deadline = time.time() + self.START_S
                    continue
                why = f"exit status {exited}" if exited is not None else f"no health in {self.START_S} s"
                raise RuntimeError(f"llama-server did not become healthy ({why}, {self.config}): "
                                   f"{said}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def completion_timed(self, ids: list[int], max_tokens: int) -> tuple[float, float, int]:
        """One greedy streamed /completion of these token ids (no prompt cache, no early
        stop) -> (ttft s, decode tok/s after the first token, tokens)."""
        start = time.perf_counter()
        conn, resp = _post(self.port, "/completion", {
            "prompt": ids, "n_predict": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "cache_prompt": False})
        first, last, count, _ = self._read(resp)
        conn.close()
        decode = (count - 1) / (last - first) if count > 1 and last > first else float("nan")
        return first - start, decode, count

    def chat_timed(self, messages: list[dict], max_tokens: int) -> tuple[int, float, dict]:
        """One greedy streamed chat turn (the GGUF's own template) -> (tokens, decode s, the
        server's timings: with speculation, draft_n drafts tested and draft_n_accepted)."""
        conn, resp = _post(self.port, "/v1/chat/completions", {
            "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "timings_per_token": False})
        first, last, count, timings = self._read(resp)
        conn.close()
        return count, (last - first) if first else 0.0, timings

    @staticmethod
    def _read(resp) -> tuple[float, float, int, dict]:
        """A stream -> (first content time, last, tokens: the server's predicted_n where it
        reports timings, else content events; its last timings, {} where none)."""
        if resp.status != 200:
            raise RuntimeError(f"llama-server: HTTP {resp.status}: {resp.read()[:500]!r}")
        first = last = None
        events, predicted, timings = 0, None, {}
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            timings = event.get("timings") or timings
            predicted = timings.get("predicted_n") or predicted
            delta = event.get("content") or ((event.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if delta:
                last = time.perf_counter()
                first, events = first or last, events + 1
        return first, last, predicted or events, timings


def llama_bench(bin_dir: pathlib.Path, gguf: pathlib.Path, threads: int, prompt: int,
                new: int) -> dict:
    """llama-bench's pp (prompt tok/s) and tg (decode tok/s), its default 5 repetitions, and
    its config: "default", or repacking off where the default died on a signal (as Server)."""
    command = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p",
               str(prompt), "-n", str(new), "-o", "json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    result: dict = {"config": "default"}
    if _killed(out.returncode):
        result["config"] = (f"{' '.join(NO_REPACK_BENCH)}: its default died on signal "
                            f"{-out.returncode}")
        print(f"llama-bench: {result['config']}; running it again so", file=sys.stderr)
        out = subprocess.run(command + list(NO_REPACK_BENCH), capture_output=True, text=True,
                             timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({result['config']}): {out.stderr[-1000:]}")
    for row in json.loads(out.stdout):
        kind = "pp" if row.get("n_prompt") else "tg"
        result[f"{kind}_tok_s"] = float(row["avg_ts"])
    return result
