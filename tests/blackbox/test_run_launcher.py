"""`make run` (tools/run.py) on a temporary socket and port: SIGTERM and SIGHUP stop both of
its children, as Ctrl-C does."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.engine import get, short_tmpdir

RUN_PY = pathlib.Path(__file__).resolve().parents[2] / "tools" / "run.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_up(sock: str, port: int) -> bool:
    try:
        if get(sock, "/health", timeout=2).status != 200:
            return False
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_stops_engine_and_proxy(engine_cache, signum):
    home = short_tmpdir()
    port = free_port()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(home), "XDG_CACHE_HOME": str(engine_cache),
           "XDG_STATE_HOME": str(home / "state"), "HOME": str(home), "KIMI_RUN_PORT": str(port)}
    env.pop("RUNTIME_DIRECTORY", None)
    env.pop("CACHE_DIRECTORY", None)
    sock = str(home / "kimi" / "engine.sock")
    run = subprocess.Popen([sys.executable, str(RUN_PY)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    children = []
    try:
        deadline = time.monotonic() + 600
        while not is_up(sock, port):
            assert run.poll() is None, "tools/run.py exited before both children were up"
            assert time.monotonic() < deadline, "engine and proxy not up"
            time.sleep(0.3)
        children = psutil.Process(run.pid).children()
        assert len(children) == 2
        run.send_signal(signum)  # to run.py alone, as systemd or a closed terminal would
        status = run.wait(90)
        for child in children:
            assert is_gone(child.pid), f"{child.name()} {child.pid} still running"
        assert status == 128 + signum
    finally:
        for proc in [run, *children]:
            if proc.is_running() if isinstance(proc, psutil.Process) else proc.poll() is None:
                proc.kill()
        shutil.rmtree(home, ignore_errors=True)
