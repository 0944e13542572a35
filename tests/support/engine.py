"""Test helpers for the engine: an HTTP client over a Unix socket and a daemon launcher.

Every call has a timeout; nothing leaves the machine.
"""
import http.client
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = pathlib.Path(sys.executable).parent
TIMEOUT_S = 120


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = TIMEOUT_S):
        super().__init__("engine", timeout=timeout)
        self.unix_path = str(path)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class Response:
    def __init__(self, status: int, headers, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def request(sock: str, method: str, path: str, body=None, headers=None,
            timeout: float = TIMEOUT_S) -> Response:
    conn = UnixConnection(sock, timeout)
    try:
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, data, {"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return Response(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def post(sock: str, path: str, body, **kw) -> Response:
    return request(sock, "POST", path, body, **kw)


def get(sock: str, path: str, **kw) -> Response:
    return request(sock, "GET", path, **kw)


def stream(sock: str, path: str, body, timeout: float = TIMEOUT_S) -> list:
    """POST a streaming request -> the list of SSE data payloads (parsed JSON, or "[DONE]")."""
    conn = UnixConnection(sock, timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return parse_sse(resp.read().decode())
    finally:
        conn.close()


def parse_sse(text: str) -> list:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def metric(sock: str, name: str, labels: str = "") -> float:
    """The value of one sample in /metrics (0 when absent)."""
    for line in get(sock, "/metrics").text.splitlines():
        if line.startswith(name + (("{" + labels + "}") if labels else " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def eventually(check, timeout: float = 10.0) -> bool:
    """True once check() is; the request log line is written just after the response."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def short_tmpdir() -> pathlib.Path:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer."""
    return pathlib.Path(tempfile.mkdtemp(prefix="kimi-t-", dir="/tmp"))


class Stoppable:
    """signal() and stop() for a helper that starts `proc` (None until then); the subclass's
    _close() releases what it opened once the process is gone."""
    proc: subprocess.Popen | None = None

    def signal(self, signum: int):
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 60) -> int:
        if self.proc is None:
            return 0
        try:
            return stop_process(self.proc, timeout)
        finally:
            self._close()

    def _close(self):
        pass


class Daemon(Stoppable):
    """A real `kimi-engine serve` subprocess on a temporary socket."""

    def __init__(self, cache_dir: pathlib.Path, *args: str, env: dict | None = None,
                 workdir: pathlib.Path | None = None):
        self.dir = workdir or short_tmpdir()
        self.sock = str(self.dir / "engine.sock")
        self.log = self.dir / "stderr.log"
        self.args = ["--socket", self.sock, *args]
        self.env = {**os.environ, "XDG_CACHE_HOME": str(cache_dir), **(env or {})}
        self.env.pop("CACHE_DIRECTORY", None)
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True, timeout: float = 600) -> "Daemon":
        self._stderr = open(self.log, "ab")
        self.proc = subprocess.Popen([str(BIN / "kimi-engine"), "serve", *self.args],
                                     env=self.env, stderr=self._stderr,
                                     stdout=subprocess.DEVNULL)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 600):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kimi-engine exited {self.proc.returncode}:\n{self.stderr()}")
            try:
                if get(self.sock, "/health", timeout=5).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"kimi-engine not ready after {timeout} s:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def _close(self):
        self._stderr.close()


def stop_process(proc: subprocess.Popen, timeout: float = 60) -> int:
    """SIGTERM, wait up to `timeout`, then SIGKILL; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def run_cli(*args: str, env: dict | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "kimi-engine"), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


class ScriptedCache(dict):
    """The stand-in's cache: a pass counter. Recurrent, with no state to snapshot, so the
    prefix cache never restores it and every request replays its script from the start."""

    is_recurrent = True

    @property
    def max_tokens(self) -> int:
        return self["max_tokens"]

    def read_rows(self, start: int, end: int) -> None:
        return None

    def write_rows(self, start: int, rows: None):
        raise AssertionError("a scripted cache is never restored")

    def save_state(self) -> None:
        return None

    def load_state(self, state: None, num_tokens: int):
        raise AssertionError("a scripted cache is never restored")


class ScriptedModel:
    """A stand-in for the model (engined/models/protocol.py): each forward pass on a cache
    yields the next token of `script` (prefill counts as the first pass). `fail_at` raises
    on that pass."""

    kv_bytes_per_token = 16
    state_bytes = 0
    weight_bytes = 0
    decode_gemv = ""
    verifies_drafts = False  # each pass yields the script's next token, whatever it is fed

    def __init__(self, vocab_size: int, script: list[int] | None = None,
                 delay_s: float = 0.0, fail_at: int | None = None):
        self.vocab_size, self.script, self.delay_s, self.fail_at = vocab_size, script or [], delay_s, fail_at

    cache_limit: int | None = None  # new_cache refuses more tokens than this

    def new_cache(self, max_tokens: int) -> ScriptedCache:
        if self.cache_limit is not None and max_tokens > self.cache_limit:
            raise ValueError(f"cache of {max_tokens} tokens: must be 1..{self.cache_limit}")
        return ScriptedCache(passes=0, max_tokens=max_tokens)

    device = "cpu"

    def graph_step(self, rows, max_context):
        return None  # decodes eagerly, as every model does on the CPU

    def decode_batch(self, tokens, caches, positions):
        import torch

        return torch.cat([self.forward(tokens[i:i + 1], cache, pos)
                          for i, (cache, pos) in enumerate(zip(caches, positions))])

    def forward(self, tokens, cache, start, last_only=True):
        import torch

        step, cache["passes"] = cache["passes"], cache["passes"] + 1
        assert start + len(tokens) <= cache["max_tokens"]
        time.sleep(self.delay_s)
        if step == self.fail_at:
            raise RuntimeError("scripted model failure")
        rows = 1 if last_only else len(tokens)
        # [rows, V]: 60 below the script's token, so sampling at temperature 1 (the API's
        # default) leaves the script with odds of 49k * e^-60 (at -10/10 it was 1e-4 a token,
        # and a scripted tool call once came back as "<tool_callAU")
        logits = torch.full((rows, self.vocab_size), -50.0)
        logits[-1, self.script[min(step, len(self.script) - 1)]] = 10.0
        return logits


class InProcessEngine:
    """The real App, Engine and HTTP server in this process, around any model object."""

    def __init__(self, model, tokenizer, chat, max_context: int = 512):
        from engined.chat import IncrementalDecoder
        from engined.engine.loop import Engine
        from engined.serving.generate import Served
        from engined.serving.http_server import UnixHTTPServer
        from engined.serving.listen import Listener
        from engined.serving.logs import LogSink
        from engined.metrics import EngineMetrics
        from engined.serving.routes import App

        self.dir = short_tmpdir()
        self.sock = str(self.dir / "engine.sock")
        self.metrics = EngineMetrics()
        self.engine = Engine(model, max_context, self.metrics)
        served = Served(self.engine, tokenizer, chat, "scripted-model", max_context,
                        IncrementalDecoder)
        self.listener = Listener(pathlib.Path(self.sock))
        self.log = LogSink(self.dir / "engine.log")
        self.server = UnixHTTPServer(self.listener.sock, App(served, self.metrics, self.log))
        self._thread = None

    def __enter__(self) -> "InProcessEngine":
        import threading

        self.engine.start()
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        import shutil

        self.server.is_draining = True
        self.server.shutdown()
        self.server.server_close()
        self.engine.stop()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def load_default_model(tmp_path_factory):
    """The default model (SmolLM2 repacked to INT4) as serve loads it, from a private cache
    holding the run's artifact: what a test package's model fixture returns."""
    import pytest

    from engined.weights import loader
    from tests.support import default_artifact
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(default_artifact.seed(tmp_path_factory.mktemp("cache"),
                                                              tmp_path_factory)))
        mp.delenv("CACHE_DIRECTORY", raising=False)
        return loader.load_model("default", threads=min(2, os.cpu_count() or 1), progress=False)
