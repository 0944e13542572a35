"""The engine's peer (issue 25, item 1): the proxy speaks only to an engine socket served by
its own user (or root). Another user's fake engine gets a 502 in the caller's dialect and one
log line, and is never sent the request."""
import logging
import os
import pwd
import socket
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from proxy.app import create_app
from proxy.config import ConfigError
from proxy.upstream import peer
from proxy.upstream.client import Upstream
from tests.proxy.test_errors import VALID, assert_shape
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

ROUTES = [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"),
          ("/v1/responses", "openai")]
COMPLETION = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "rm -rf ~"},
                           "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

# A stand-in engine that binds as root, becomes UID and then listens (SO_PEERCRED records the
# listener's credentials at listen()); it answers every request with COMPLETION.
STRANGER = textwrap.dedent("""
    import json, os, socketserver, sys
    from http.server import BaseHTTPRequestHandler
    path, uid, body = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args): pass
        def answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        do_GET = do_POST = answer
    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True
        def get_request(self):
            return self.socket.accept()[0], ("unix", 0)
    server = Server(path, Handler, bind_and_activate=False)
    server.server_bind()
    os.setgid(uid); os.setuid(uid)
    server.server_activate()
    print("ready", flush=True)
    server.serve_forever()
""")


@pytest.fixture
def stranger(tmp_path):
    """The unix:// URL of an engine socket served by nobody (a second uid: needs root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to serve a socket as a second uid (nobody); run as root")
    import json
    uid = pwd.getpwnam("nobody").pw_uid
    path = tmp_path / "engine.sock"
    proc = subprocess.Popen([sys.executable, "-c", STRANGER, str(path), str(uid),
                             json.dumps(COMPLETION)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield f"unix://{path}", uid
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,dialect", ROUTES)
def test_another_users_engine_is_a_502_and_one_log_line(stranger, tmp_path, caplog, route,
                                                         dialect, stream):
    url, uid = stranger
    client = create_app(proxy_config(url, tmp_path)).test_client()
    with caplog.at_level(logging.WARNING, logger="kimi.proxy"):
        resp = client.post(route, json={**VALID[route], "stream": stream})
    assert_shape(resp, dialect, 502)
    assert "served by another user (uid %d)" % uid in resp.get_json()["error"]["message"]
    assert client.post(route, json={**VALID[route], "stream": stream}).status_code == 502
    refusals = [r for r in caplog.records if "refusing the engine socket" in r.getMessage()]
    assert len(refusals) == 1 and f"uid {uid} (pid " in refusals[0].getMessage()  # not per request


def test_engine_user_trusts_that_users_engine(stranger, tmp_path):
    """The packaged units: the engine runs as kimi, the proxy as kimi-proxy (here: root)."""
    url, uid = stranger
    for user in ("nobody", str(uid)):
        client = create_app(proxy_config(url, tmp_path, ENGINE_USER=user)).test_client()
        resp = client.post("/v1/chat/completions", json=VALID["/v1/chat/completions"])
        assert resp.status_code == 200, resp.get_json()
    assert Upstream(url, timeout_s=5, engine_uid=uid).health()[0]


def test_another_users_engine_fails_health_and_doctor(stranger):
    url, uid = stranger
    is_ok, detail = Upstream(url, timeout_s=5).health()
    assert not is_ok and f"uid {uid}" in detail


def test_the_check_compares_the_listeners_uid(tmp_path, monkeypatch):
    """Without root: our own fake engine, and a proxy that trusts only some other uid."""
    fake = FakeUpstream(Reply.text("ok"), Reply.text("ok"))
    with fake.serve_unix(str(tmp_path / "engine.sock")) as url:
        app = create_app(proxy_config(url, tmp_path))
        client = app.test_client()
        assert client.post("/v1/chat/completions", json=VALID["/v1/chat/completions"]).status_code == 200
        app.extensions["kimi"].upstream.close()  # the check is per connection: none pooled
        monkeypatch.setattr(peer, "trusted_uids", lambda engine_uid: (os.geteuid() + 4242,))
        resp = client.post("/v1/messages", json=VALID["/v1/messages"])
        assert_shape(resp, "anthropic", 502)
        assert len(fake.requests) == 1  # the refused request never reached it


def test_engine_user_without_root(tmp_path, monkeypatch):
    """Our own fake engine, and a proxy that pretends to run as another user: refused unless
    engine-user names the engine's user."""
    if os.geteuid() == 0:
        pytest.skip("as root the fake engine is root's, always trusted: see the test with nobody")
    monkeypatch.setattr(peer, "os", SimpleNamespace(geteuid=lambda: os.geteuid() + 4242))
    fake = FakeUpstream(Reply.text("ok"))
    with fake.serve_unix(str(tmp_path / "engine.sock")) as url:
        refusing = create_app(proxy_config(url, tmp_path)).test_client()
        assert refusing.post("/v1/messages", json=VALID["/v1/messages"]).status_code == 502
        user = pwd.getpwuid(os.geteuid()).pw_name
        trusting = create_app(proxy_config(url, tmp_path, ENGINE_USER=user)).test_client()
        assert trusting.post("/v1/messages", json=VALID["/v1/messages"]).status_code == 200
    assert len(fake.requests) == 1


@pytest.mark.parametrize("value,expected", [(None, None), ("", None), ("0", 0), (4242, 4242),
                                            ("nobody", "nobody")])
def test_engine_user_config(tmp_path, value, expected):
    cfg = proxy_config("unix:///nowhere", tmp_path, ENGINE_USER=value)
    uid = pwd.getpwnam(expected).pw_uid if isinstance(expected, str) else expected
    assert cfg["ENGINE_USER"] == uid


def test_engine_user_must_be_a_user(tmp_path):
    with pytest.raises(ConfigError, match="engine-user 'no-such-user-kimi' is not a user"):
        proxy_config("unix:///nowhere", tmp_path, ENGINE_USER="no-such-user-kimi")


def test_our_own_and_roots_peers_are_trusted():
    left, right = socket.socketpair()
    with left, right:
        peer.check_peer(left, "socketpair")  # ours: no error
    assert peer.trusted_uids() == (os.geteuid(), 0)
