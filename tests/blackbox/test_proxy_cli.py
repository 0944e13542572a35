"""Black-box: `python -m proxy` as a subprocess (gevent server) in front of the fake upstream."""
import os
import signal
import socket
import subprocess
import sys
import time

import anthropic
import openai
import pytest

from proxy import __version__
from tests.support.proxy_fakes import FakeUpstream, Reply

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"proxy exited early: {proc.communicate()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("proxy did not listen")


def run_cli(*args, env=None, timeout=30):
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}


def test_version_and_bad_config(env):
    out = run_cli("--version", env=env)
    assert out.returncode == 0 and __version__ in out.stdout
    bad = run_cli("serve", "--reasoning-field", "sideways", env=env)
    assert bad.returncode == 1 and "reasoning-field must be one of" in bad.stderr and "Traceback" not in bad.stderr


def test_serve_banner_sdks_and_sighup(tmp_path, env):
    fake = FakeUpstream(Reply.text("Hi from gevent.", reasoning="hmm"))
    port, log = free_port(), tmp_path / "proxy.log"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    env = {**env, "NOTIFY_SOCKET": str(tmp_path / "notify")}
    with fake.serve() as upstream:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream,
                                 "--log-file", str(log), "--api-key", "k3y"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_port(port, proc)
            assert notify.recv(64) == b"READY=1"  # systemd Type=notify
            base = f"http://127.0.0.1:{port}"
            oa = openai.OpenAI(base_url=base + "/v1", api_key="k3y", max_retries=0, timeout=10)
            chunks = list(oa.chat.completions.create(model="m", stream=True,
                                                     messages=[{"role": "user", "content": "hi"}]))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi from gevent."
            an = anthropic.Anthropic(base_url=base, api_key="k3y", max_retries=0, timeout=10)
            msg = an.messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}])
            assert msg.content[-1].text == "Hi from gevent."
            os.rename(log, tmp_path / "proxy.log.1")
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.5)
            oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
            deadline = time.monotonic() + 5
            while not (log.exists() and "status=200" in log.read_text()) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "status=200" in log.read_text()  # reopened after SIGHUP
            assert "status=200" in (tmp_path / "proxy.log.1").read_text()
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    for needle in ("ANTHROPIC_BASE_URL=http://localhost:", "codex", "opencode", "aider", "OPENAI_BASE_URL=",
                   "ANTHROPIC_API_KEY=$KIMI_API_KEY", "api key  set (not shown)"):
        assert needle in out, out
    assert "k3y" not in out + err  # the key never reaches the journal


def test_doctor(env):
    port = free_port()
    down = run_cli("doctor", "--upstream", "http://127.0.0.1:1/v1", "--port", str(port), env=env)
    assert down.returncode == 1 and "x upstream http://127.0.0.1:1/v1" in down.stdout and "Traceback" not in down.stderr
    with FakeUpstream().serve() as upstream:
        ok = run_cli("doctor", "--upstream", upstream, "--port", str(port), env=env)
    assert ok.returncode == 0 and "ok upstream" in ok.stdout and f"ok port 127.0.0.1:{port}" in ok.stdout
    assert "ok ledger" in ok.stdout
    bad = run_cli("doctor", "--upstream", "http://127.0.0.1:1/v1", "--ledger", "/proc/nope/ledger.sqlite", env=env)
    assert bad.returncode == 1 and "x ledger /proc/nope/ledger.sqlite" in bad.stdout
