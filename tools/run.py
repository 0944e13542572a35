"""`make run`: start kimi-engine and kimi-proxy in the foreground; Ctrl-C stops both cleanly.

The engine serves the embedded default model on its default socket; the proxy listens on
127.0.0.1:8080 (override with KIMI_RUN_PORT) and prints the client set-up lines once the
engine is ready.
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


def wait_for_engine(engine: subprocess.Popen, sock_path: str) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if engine.poll() is not None:
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

    sock_path = str(default_socket_path())
    port = os.environ.get("KIMI_RUN_PORT", "8080")
    engine = subprocess.Popen([BIN / "kimi-engine", "serve", "--model", "default",
                               "--socket", sock_path])
    procs = [engine]
    signal.signal(signal.SIGINT, lambda *_: None)  # children get Ctrl-C too; we wait for them
    try:
        if not wait_for_engine(engine, sock_path):
            print("kimi-engine did not become ready; see its messages above", file=sys.stderr)
            return 1
        proxy = subprocess.Popen([BIN / "kimi-proxy", "serve", "--upstream", f"unix://{sock_path}",
                                  "--port", port])
        procs.append(proxy)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return 0
    finally:
        stop(procs)
        print("kimi-local stopped", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
