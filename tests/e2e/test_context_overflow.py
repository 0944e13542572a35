"""What kimi-proxy answers, in front of kimi-engine's default model (8k context), to the first
request Codex and Claude Code sent (the captures in tests/fixtures/live-clients): the engine's
`context_length_exceeded` must come through with a hint at what to serve instead.
"""
import gzip
import http.client
import json
import os
import signal
import socket
import subprocess
import time

import pytest

from tests.e2e.harness import ROOT, EngineRun

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(600)]  # the engine may load slowly

CAPTURES = ROOT / "tests" / "fixtures" / "live-clients"
ENGINE_WAIT_S = 300
HOP_BY_HOP = {"host", "content-length", "content-encoding", "transfer-encoding", "accept-encoding"}


def first_post(capture: str) -> dict:
    with gzip.open(CAPTURES / f"{capture}.jsonl.gz", "rt") as f:
        return next(r for r in map(json.loads, f) if r["method"] == "POST")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def proxy_port(tmp_path_factory):
    engine, port = EngineRun(tmp_path_factory.mktemp("overflow")), free_port()
    proc = subprocess.Popen(["bash", "-c", engine.server_cmd(port)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + ENGINE_WAIT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, engine.logs()
                time.sleep(0.2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def replay(port: int, capture: str) -> tuple[int, dict]:
    request = first_post(capture)
    headers = {k: v for k, v in request["headers"] if k.lower() not in HOP_BY_HOP}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", request["path"], json.dumps(request["body"]), headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_codex_gets_context_length_exceeded(proxy_port):
    status, body = replay(proxy_port, "codex-text")
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded", body
    assert body["error"]["type"] == "invalid_request_error", body
    assert "8192" in body["error"]["message"] and "Kimi-Linear" in body["error"]["message"], body


def test_claude_code_gets_an_invalid_request_naming_the_context(proxy_port):
    status, body = replay(proxy_port, "claude-text")
    assert status == 400, body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert "8192" in body["error"]["message"] and "Kimi-Linear" in body["error"]["message"], body
    # a first turn cannot be compacted: no "prompt is too long" lead (proxy/errors.py)
    assert not body["error"]["message"].startswith("prompt is too long"), body


@pytest.mark.parametrize("capture", ["codex-text", "claude-text"])
def test_hint_names_a_context_that_fits(proxy_port, capture):
    _, body = replay(proxy_port, capture)
    assert "--max-context 65536" in body["error"]["message"], body
