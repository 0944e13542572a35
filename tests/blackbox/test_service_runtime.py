"""The packaged services at run time, started from their units' exact ExecStart lines under a
temporary root: Type=notify readiness, log rotation on SIGHUP (rename, and logrotate -f when
installed), and SIGTERM with streams in flight. One engine and one proxy (in front of it,
through the shipped proxy.toml) serve the module; the SIGTERM tests run last."""
import contextlib
import gzip
import http.client
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time

import pytest

from tests.support.engine import UnixConnection, eventually, get, parse_sse, post, short_tmpdir
from tests.support.proxy_fakes import FakeUpstream, Reply
from tests.blackbox.service_helpers import BIN, ROOT, Service, ServiceRoot, chat_body, free_port, http_health

ENGINE_UNIT, PROXY_UNIT = "kimi-engine.service", "kimi-proxy.service"


@pytest.fixture(scope="module")
def root():
    path = short_tmpdir()  # the engine socket lives under it: keep it short
    yield ServiceRoot(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def engine(root):
    root.write_config("engine.toml", "max-context = 4096\n")
    # The unit's EnvironmentFile= wins over the config file (KIMI_ENGINE_* > file).
    root.path("/etc/kimi/engine.env").write_text("# smaller KV cache for tests\nKIMI_ENGINE_MAX_CONTEXT=512\n")
    sock = str(root.path("/run/kimi/engine.sock"))
    service = Service(root, ENGINE_UNIT, lambda: get(sock, "/health", timeout=5).status)
    service.sock = sock
    service.log = root.path("/var/log/kimi/engine.log")
    yield service.start()
    service.stop()


@pytest.fixture(scope="module")
def proxy(root, engine):
    port = free_port()
    root.write_config("proxy.toml", f"port = {port}\n")
    service = Service(root, PROXY_UNIT, lambda: http_health(port))
    service.port = port
    service.log = root.path("/var/log/kimi-proxy/proxy.log")
    yield service.start(timeout=60)
    service.stop()


def test_units_start_from_their_exact_execstart(engine, proxy, root):
    for service, name in ((engine, "kimi-engine"), (proxy, "kimi-proxy")):
        assert service.argv[:2] == [str(BIN / name), "serve"]
        assert service.argv[2:4] == ["--config", str(root.path(f"/etc/kimi/{name[5:]}.toml"))]
        assert not any(re.match(r"/(etc|run|var)/", arg) for arg in service.argv)
    assert engine.env["TRITON_CACHE_DIR"] == str(root.path("/var/cache/kimi/triton"))
    assert engine.env["KIMI_ENGINE_MAX_CONTEXT"] == "512"
    assert "(max context 512 tokens)" in engine.log.read_text()  # env file over config file
    from engined import helper  # the kernels are chosen at run time, and said at start
    from engined.models import llama
    op = llama.decode_gemv_op("cpu")
    said = (f"projections w4a8_tiles ({helper.tiles_kernels()})"
            if op == "w4a8_tiles" else f"decode GEMV {op}")
    assert f"integer dots; {said}" in engine.log.read_text()


def test_engine_ready_only_after_health_answers(engine):
    assert engine.health_at_ready == 200  # probed once, the moment READY=1 arrived
    ready = next(m for m in engine.notify.received if "READY=1" in m.split("\n"))
    assert "STATUS=serving SmolLM2-135M-Instruct" in ready
    first = engine.notify.received[0]
    assert first.startswith("STATUS=loading") and "READY=1" not in first  # status while loading
    # The socket came from RUNTIME_DIRECTORY, as under systemd, with the unit's mode.
    assert stat.S_IMODE(os.stat(engine.sock).st_mode) == 0o660


def test_proxy_ready_only_after_health_answers(proxy, engine):
    # 200 (not 503) means the proxy already reached the engine through the shipped config.
    assert proxy.health_at_ready == 200
    assert proxy.notify.received[-1] == "READY=1"


def engine_request(engine: Service, request_id: str) -> int:
    return post(engine.sock, "/v1/chat/completions", chat_body("Say hi.", 1),
                headers={"x-request-id": request_id}, timeout=60).status


def proxy_request(proxy: Service, request_id: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", chat_body("Say hi.", 1),
                     {"content-type": "application/json", "x-request-id": request_id})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


class Traffic:
    """Numbered requests, sent one after another: inline, or from a thread inside `with`."""

    def __init__(self, send, service: Service, prefix: str):
        self.send, self.service, self.prefix = send, service, prefix
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._thread = None
        self._errors: list[BaseException] = []

    def one(self):
        request_id = f"{self.prefix}-{len(self.sent):04d}"
        assert self.send(self.service, request_id) == 200
        self.sent.append(request_id)

    def _loop(self):
        try:
            while not self._stop.is_set():
                self.one()
        except BaseException as exc:  # re-raised in the test's thread by __exit__
            self._errors.append(exc)

    def __enter__(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(120)
        if self._errors:
            raise self._errors[0]


def logged_ids(log, prefix: str) -> list[str]:
    """Request ids with this prefix in the log and every rotated copy (.1, .2.gz, ...)."""
    found = []
    for path in sorted(log.parent.glob(log.name + "*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            found += re.findall(rf"(?<![\w.:-])({re.escape(prefix)}-\d{{4}})(?![\w.:-])", f.read())
    return found


def assert_each_line_once(service: Service, traffic: Traffic):
    assert eventually(lambda: len(logged_ids(service.log, traffic.prefix)) >= len(traffic.sent))
    found = logged_ids(service.log, traffic.prefix)
    assert sorted(found) == sorted(traffic.sent), "lost or doubled request lines"


def rotate_by_rename(service: Service, suffix: str):
    os.rename(service.log, f"{service.log}{suffix}")
    service.signal(signal.SIGHUP)
    assert eventually(service.log.exists), "SIGHUP did not reopen the log"


@pytest.mark.parametrize("which", ["engine", "proxy"])
def test_rotation_by_rename_and_sighup_keeps_every_line(which, engine, proxy):
    service, send = (engine, engine_request) if which == "engine" else (proxy, proxy_request)
    traffic = Traffic(send, service, f"mv-{which}")
    for _ in range(5):
        traffic.one()
    with traffic:  # requests keep coming while the file is renamed and reopened
        time.sleep(0.3)
        rotate_by_rename(service, f".mv-{which}")
        time.sleep(0.3)
    for _ in range(5):
        traffic.one()
    assert_each_line_once(service, traffic)
    assert logged_ids(service.log.with_name(f"{service.log.name}.mv-{which}"), traffic.prefix)
    assert re.findall(rf"{traffic.prefix}-\d{{4}}", service.log.read_text())


def test_logrotate_force_with_the_shipped_config(engine, proxy, root):
    if shutil.which("logrotate") is None:
        print("SKIP reason: logrotate is not installed (apt-get install logrotate)")
        pytest.skip("logrotate is not installed")
    config = shipped_logrotate(root, [engine.proc.pid, proxy.proc.pid])
    traffics = [Traffic(engine_request, engine, "lr-engine"), Traffic(proxy_request, proxy, "lr-proxy")]
    for rounds in range(2):  # twice: the second compresses the first (delaycompress)
        for traffic in traffics:
            traffic.one()
        with traffics[0], traffics[1]:
            time.sleep(0.3)
            result = subprocess.run(["logrotate", "-f", "-s", str(root.root / "logrotate.state"),
                                     str(config)], capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr
            assert eventually(lambda: engine.log.exists() and proxy.log.exists())
            time.sleep(0.3)
        for traffic in traffics:
            traffic.one()
    assert list(engine.log.parent.glob("engine.log.*.gz")), sorted(engine.log.parent.iterdir())
    for traffic in traffics:
        assert_each_line_once(traffic.service, traffic)


def shipped_logrotate(root: ServiceRoot, pids: list[int]):
    """systemd/kimi-local.logrotate with /var moved and postrotate HUPing the test's daemons."""
    text = root.moved((ROOT / "systemd" / "kimi-local.logrotate").read_text())
    text, count = re.subn(r"(?m)^(\s*)systemctl reload .*$",
                          lambda m: f"{m.group(1)}kill -HUP {' '.join(map(str, pids))}", text)
    assert count == 1
    path = root.root / "logrotate.conf"
    path.write_text(text)
    return path


@contextlib.contextmanager
def proxy_before_fake(reply: Reply, env: dict | None = None):
    """A proxy started from its unit, whose shipped upstream socket is a scripted fake."""
    root = ServiceRoot(short_tmpdir())
    port = free_port()
    root.write_config("proxy.toml", f"port = {port}\n")
    fake = FakeUpstream(reply)
    upstream_sock = root.path("/run/kimi/engine.sock")
    upstream_sock.parent.mkdir(parents=True, exist_ok=True)
    try:
        with fake.serve_unix(str(upstream_sock)):
            proxy = Service(root, PROXY_UNIT, lambda: http_health(port))
            proxy.env.update(env or {})
            proxy.port, proxy.fake = port, fake
            try:
                yield proxy.start(timeout=60)
            finally:
                proxy.stop()
    finally:
        shutil.rmtree(root.root, ignore_errors=True)


def test_proxy_sigterm_lets_open_streams_finish():
    with proxy_before_fake(Reply.text("x" * 40, size=1, delay_s=0.05)) as proxy:  # ~2 s each
        idle = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        idle.request("GET", "/health")  # kept alive: must not hold the drain up
        assert idle.getresponse().read()
        streams = [OpenStream.proxy(proxy.port) for _ in range(2)]
        proxy.signal(signal.SIGTERM)
        started = time.monotonic()
        events = [s.finish() for s in streams]
        assert proxy.proc.wait(30) == 0
        assert time.monotonic() - started < 15  # the streams' ~2 s, not the 25 s drain bound
        idle.close()
        assert "STOPPING=1" in proxy.notify.drain()
        # The fake counts a stream once its last chunk is sent, which can be after the proxy
        # has already relayed it and exited: wait for the count, don't race it. (It counted after
        # [DONE] and the chunked terminator; a proxy exiting once it had relayed the finish
        # could make those writes fail, and a complete stream counted as cancelled: 2 runs of
        # 10 with the host's 2 cores kept busy.)
        assert eventually(lambda: proxy.fake.completed == 2, timeout=5)
        assert proxy.fake.cancelled == 0
        assert http_health(proxy.port) == 0  # nothing listens any more
    for stream_events in events:
        assert stream_events[-1] == "[DONE]"
        assert finish_reasons(stream_events) == ["stop"]
        text = "".join(e["choices"][0]["delta"].get("content") or ""
                       for e in stream_events[:-1] if e.get("choices"))
        assert text == "x" * 40


def test_proxy_sigterm_ends_a_stream_past_the_drain_time_with_an_error():
    slow = Reply.text("y" * 400, size=1, delay_s=0.05)  # ~20 s: longer than the drain time
    with proxy_before_fake(slow, {"KIMI_PROXY_DRAIN_TIMEOUT_S": "1"}) as proxy:
        stream = OpenStream.proxy(proxy.port)
        proxy.signal(signal.SIGTERM)
        started = time.monotonic()
        events = stream.finish()  # a complete chunked body: no IncompleteRead
        assert proxy.proc.wait(30) == 0
        assert time.monotonic() - started < 10
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "service_unavailable" and "shutting down" in error["message"]
    assert finish_reasons(events) == []


def finish_reasons(events: list) -> list:
    return [e["choices"][0]["finish_reason"] for e in events[:-1]
            if e.get("choices") and e["choices"][0].get("finish_reason")]


class OpenStream:
    """A streaming chat request whose first event has arrived; finish() reads the rest."""

    def __init__(self, conn: http.client.HTTPConnection, body: str):
        self.conn = conn
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        self.resp = conn.getresponse()
        assert self.resp.status == 200
        self.head = self.resp.readline()
        assert self.head.startswith(b"data: ")

    @classmethod
    def proxy(cls, port: int) -> "OpenStream":
        return cls(http.client.HTTPConnection("127.0.0.1", port, timeout=60),
                   chat_body("Count.", 40, stream=True))

    @classmethod
    def engine(cls, sock: str, max_tokens: int) -> "OpenStream":
        body = json.loads(chat_body("Count to a hundred.", max_tokens, stream=True))
        # one token a step (no drafts), so the streams are still open at the signal; a chunk
        # holds every token there was when the HTTP thread got to it (several steps' on a busy
        # host: 38 chunks for 48 tokens seen), so each chunk's token ids count the tokens
        return cls(UnixConnection(sock, timeout=120),
                   json.dumps({**body, "ignore_eos": True, "speculative": False,
                               "return_token_ids": True}))

    def finish(self) -> list:
        try:
            return parse_sse((self.head + self.resp.read()).decode())
        finally:
            self.conn.close()


def test_engine_sigterm_lets_open_streams_finish(engine, proxy):
    """Last in the module: it stops the shared engine (the proxy stays up in front of it)."""
    streams = [OpenStream.engine(engine.sock, 48) for _ in range(2)]
    engine.signal(signal.SIGTERM)
    started = time.monotonic()
    for stream_events in [s.finish() for s in streams]:
        assert stream_events[-1] == "[DONE]"
        assert finish_reasons(stream_events) == ["length"]
        assert sum(len(e["choices"][0].get("token_ids", ())) for e in stream_events[:-1]
                   if e.get("choices")) == 48  # the whole completion, not a cut-off stream
        assert any(e["choices"][0]["delta"].get("content") for e in stream_events[:-1]
                   if e.get("choices"))
    assert engine.proc.wait(60) == 0
    assert time.monotonic() - started < 60
    assert not os.path.exists(engine.sock)
    assert "STOPPING=1" in engine.notify.drain()
    assert "kimi-engine: stopped" in engine.log.read_text()

