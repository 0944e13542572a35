"""The daemon's life: a stale socket is replaced, SIGHUP reopens the log, SIGTERM drains,
plus the command line: --help, --version, the memory-cap refusal and config layering."""
import os
import shutil
import signal
import socket
import stat
import threading
import time

import pytest

from tests.support.engine import Daemon, eventually, metric, post, run_cli, short_tmpdir

CAPITAL = [{"role": "user", "content": "Which city is the capital of France?"}]


@pytest.fixture
def workdir():
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_stale_socket(path: str):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays; nobody listens


def test_stale_socket_sighup_and_sigterm_drain(engine_cache, workdir):
    log = workdir / "engine.log"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(workdir / "notify"))
    notify.settimeout(5)
    daemon = Daemon(engine_cache, "--max-context", "512", "--log-file", str(log),
                    workdir=workdir, env={"NOTIFY_SOCKET": str(workdir / "notify")})
    make_stale_socket(daemon.sock)
    daemon.start()
    try:
        assert notify.recv(256).startswith(b"STATUS=loading")  # while loading
        assert notify.recv(256).split(b"\n")[0] == b"READY=1"  # sent once the socket listens
        assert stat.S_IMODE(os.stat(daemon.sock).st_mode) == 0o660
        post(daemon.sock, "/v1/chat/completions", {"messages": CAPITAL, "max_tokens": 2},
             headers={"x-request-id": "before-rotate"})
        assert eventually(lambda: "request_id=before-rotate" in log.read_text())
        rotated = workdir / "engine.log.1"
        os.rename(log, rotated)
        daemon.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not log.exists():
            assert time.monotonic() < deadline, "SIGHUP did not reopen the log file"
            time.sleep(0.1)
        post(daemon.sock, "/v1/chat/completions", {"messages": CAPITAL, "max_tokens": 2},
             headers={"x-request-id": "after-rotate"})
        assert "request_id=before-rotate" in rotated.read_text()
        assert eventually(lambda: "request_id=after-rotate" in log.read_text())
        assert "after-rotate" not in rotated.read_text()

        result = {}
        worker = threading.Thread(target=lambda: result.update(resp=post(
            daemon.sock, "/v1/chat/completions",
            {"messages": CAPITAL, "max_tokens": 60, "ignore_eos": True, "temperature": 0})))
        worker.start()
        assert eventually(lambda: metric(daemon.sock, "kimi_engine_running_requests") == 1)
        daemon.signal(signal.SIGTERM)  # while the request is generating
        worker.join(120)
        assert result["resp"].status == 200
        assert result["resp"].json()["usage"]["completion_tokens"] == 60
        assert daemon.proc.wait(60) == 0
        assert not os.path.exists(daemon.sock)
        assert "stopped" in log.read_text()
        assert notify.recv(256) == b"STOPPING=1"
    finally:
        notify.close()
        daemon.stop()


def test_help_and_version():
    top = run_cli("--help")
    assert top.returncode == 0 and "serve" in top.stdout
    version = run_cli("--version")
    assert version.returncode == 0 and "kimi-engine" in version.stdout
    serve = run_cli("serve", "--help")
    assert serve.returncode == 0
    for option in ("--model", "--socket", "--device", "--memory-cap", "--max-context",
                   "--threads", "--log-file", "--config"):
        assert option in serve.stdout


def test_memory_cap_refuses_to_start_with_the_budget(engine_cache, workdir):
    result = run_cli("serve", "--socket", str(workdir / "e.sock"), "--memory-cap", "100MB",
                     "--max-context", "2048", env={"XDG_CACHE_HOME": str(engine_cache)})
    assert result.returncode == 1
    assert "refusing to start" in result.stderr
    for word in ("weights", "KV cache", "2048 tokens", "cap 95.4 MiB"):
        assert word in result.stderr
    assert not (workdir / "e.sock").exists()


def _cap_in_message(engine_cache, workdir, *args, env=None) -> str:
    result = run_cli("serve", "--socket", str(workdir / "e.sock"), *args,
                     env={"XDG_CACHE_HOME": str(engine_cache), **(env or {})})
    assert result.returncode == 1, result.stderr
    return result.stderr.split("cap ")[-1].split(" (")[0]


def test_config_file_env_and_flag_precedence(engine_cache, workdir):
    config = workdir / "engine.toml"
    config.write_text('memory-cap = "1KiB"\nmax-context = 512\n')
    assert _cap_in_message(engine_cache, workdir, "--config", str(config)) == "1.0 KiB"
    env = {"KIMI_ENGINE_MEMORY_CAP": "2KiB"}
    assert _cap_in_message(engine_cache, workdir, "--config", str(config), env=env) == "2.0 KiB"
    assert _cap_in_message(engine_cache, workdir, "--config", str(config),
                           "--memory-cap", "3KiB", env=env) == "3.0 KiB"


@pytest.mark.parametrize("content,expected", [
    ('memory-cap = "1KiB"\nbogus-key = 1\n', "unknown key(s) bogus-key"),
    ('memory-cap = "lots"\n', "memory-cap: expected a size"),
    ('max-context = -5\n', "max-context: must not be negative"),
    ('this is not toml', "not valid TOML"),
])
def test_bad_config_file_is_a_usage_error(workdir, content, expected):
    config = workdir / "engine.toml"
    config.write_text(content)
    result = run_cli("serve", "--config", str(config), timeout=60)
    assert result.returncode == 2
    assert expected in result.stderr


@pytest.mark.parametrize("args,expected", [
    (("--model", "/nonexistent/model.gguf"), "no such file"),
    (("--log-file", "/nonexistent/dir/engine.log"), "cannot open --log-file"),
])
def test_start_failures_exit_1_with_a_message(engine_cache, workdir, args, expected):
    result = run_cli("serve", "--socket", str(workdir / "e.sock"), *args,
                     env={"XDG_CACHE_HOME": str(engine_cache)})
    assert result.returncode == 1
    assert expected in result.stderr and "Traceback" not in result.stderr
