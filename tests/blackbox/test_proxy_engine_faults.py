"""Black-box: the real `kimi-engine` behind the real `kimi-proxy` when the engine restarts,
and when a non-stream client leaves (issue 13, items 1 and 2)."""
import http.client
import json
import shutil
import socket
import threading
import time

import pytest

from tests.support.engine import Daemon, metric
from tests.support.stack import proxy_in_front

QUESTION = [{"role": "user", "content": "Which city is the capital of France?"}]


@pytest.fixture(scope="module")
def stack(engine_cache, tmp_path_factory):
    engine = Daemon(engine_cache, "--max-context", "2048", "--threads", "2").start()
    with proxy_in_front(engine, tmp_path_factory.mktemp("proxy-state")) as port:
        yield engine, port
    engine.stop()
    shutil.rmtree(engine.dir, ignore_errors=True)


def chat(port: int, **fields) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        body = {"model": "m", "max_tokens": 4, "temperature": 0, "messages": QUESTION, **fields}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_an_engine_restart_under_a_live_proxy_fails_no_request(stack):
    engine, port = stack
    statuses = []
    workers = [threading.Thread(target=lambda: statuses.append(chat(port)[0])) for _ in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert statuses == [200] * 6  # the proxy now pools several idle engine connections
    engine.stop()
    engine.start()  # waits until the engine is ready again
    after = [chat(port) for _ in range(8)]
    assert [status for status, _body in after] == [200] * 8, after


def test_a_non_stream_client_that_leaves_cancels_the_engine_request(stack):
    engine, port = stack
    cancelled = metric(engine.sock, "kimi_engine_cancelled_requests_total")
    body = json.dumps({"model": "m", "max_tokens": 1200, "ignore_eos": True, "messages": QUESTION}).encode()
    client = socket.create_connection(("127.0.0.1", port), timeout=30)
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 30
    while metric(engine.sock, "kimi_engine_generated_tokens_total") == 0 or \
            metric(engine.sock, "kimi_engine_running_requests") == 0:
        assert time.monotonic() < deadline, "the engine never started generating"
        time.sleep(0.05)
    client.close()
    left = time.monotonic()
    while metric(engine.sock, "kimi_engine_cancelled_requests_total") == cancelled:
        assert time.monotonic() - left < 2.0, "the engine kept generating for a client that left"
        time.sleep(0.05)
    generated = metric(engine.sock, "kimi_engine_generated_tokens_total")
    time.sleep(1.0)
    assert metric(engine.sock, "kimi_engine_generated_tokens_total") == generated  # generation stopped
    assert chat(port)[0] == 200  # and the proxy serves the next request
