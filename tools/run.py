"""`make run`: start kimi-engine and kimi-proxy in the foreground; Ctrl-C, SIGTERM or SIGHUP
(a closed terminal) stops both cleanly.

The engine serves the embedded default model on its default socket; the proxy listens on
127.0.0.1:8080 (override with KIMI_RUN_PORT) and prints the client set-up lines once the
engine is ready. `make run MODEL=ORG/REPO` (KIMI_RUN_MODEL) serves a Hugging Face id instead:
`kimi-engine pull` first, in the foreground with its progress, then serve with a context
Claude Code fits in (KIMI_ENGINE_MAX_CONTEXT, else 65536).
"""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

BIN = pathlib.Path(sys.executable).parent
READY_TIMEOUT_S = 900  # the first start repacks the default model


def engine_ready(sock_path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(sock_path)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


class StopSignals:
    """SIGTERM and SIGHUP only set a flag (the children never see them: they are not sent to
    the process group); the wait loops poll it and `stop` then ends both children. Ctrl-C
    reaches the children itself, so SIGINT is only noted."""

    def __init__(self):
        self.received: int | None = None
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame):
        self.received = signum

    @property
    def is_stop_requested(self) -> bool:
        return self.received in (signal.SIGTERM, signal.SIGHUP)


def wait_for_engine(engine: subprocess.Popen, sock_path: str, signals: StopSignals) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if engine.poll() is not None or signals.is_stop_requested:
            return False
        if engine_ready(sock_path):
            return True
        time.sleep(0.2)
    return False


def stop(procs: list[subprocess.Popen]):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> int:
    from engined.config import default_socket_path
    from engined.weights.hub import ids

    sock_path = str(default_socket_path())
    port = os.environ.get("KIMI_RUN_PORT", "8080")
    model = os.environ.get("KIMI_RUN_MODEL") or "default"
    serve = [BIN / "kimi-engine", "serve", "--model", model, "--socket", sock_path]
    if ids.parse(model) is not None:
        pulled = subprocess.run([BIN / "kimi-engine", "pull", model])
        if pulled.returncode:
            return pulled.returncode
        if not os.environ.get("KIMI_ENGINE_MAX_CONTEXT"):
            serve += ["--max-context", "65536"]
    signals = StopSignals()  # before the first child: no moment leaves one behind
    engine = subprocess.Popen(serve)
    procs = [engine]
    try:
        if not wait_for_engine(engine, sock_path, signals):
            if signals.is_stop_requested:
                return 128 + signals.received
            print("kimi-engine did not become ready; see its messages above", file=sys.stderr)
            return 1
        proxy = subprocess.Popen([BIN / "kimi-proxy", "serve", "--upstream", f"unix://{sock_path}",
                                  "--port", port])
        procs.append(proxy)
        while all(p.poll() is None for p in procs) and not signals.is_stop_requested:
            time.sleep(0.2)
        return 128 + signals.received if signals.is_stop_requested else 0
    finally:
        stop(procs)
        print("kimi-local stopped", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
