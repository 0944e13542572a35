"""Black-box limits of the real daemon (default model, a small context so each test is short):
a prompt far over the context, text that is not Unicode, and the bounded queue."""
import json
import shutil
import threading
import time

import pytest

from tests.support.engine import Daemon, get, post

HI = [{"role": "user", "content": "Say hello."}]
MAX_CONTEXT = 256


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "engine-cache"  # shared with the engine tests


@pytest.fixture(scope="module")
def engine(engine_cache):
    daemon = Daemon(engine_cache, "--max-context", str(MAX_CONTEXT), "--threads", "1").start()
    yield daemon
    daemon.stop()
    shutil.rmtree(daemon.dir, ignore_errors=True)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


class PeakRss(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.is_done = pid, rss_bytes(pid), False

    def run(self):
        while not self.is_done:
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.01)


def timed(results: dict, name: str, fn):
    start = time.monotonic()
    results[name] = fn()
    results[name + "_s"] = time.monotonic() - start


def test_huge_prompt_is_refused_fast_beside_a_small_request(engine):
    post(engine.sock, "/v1/chat/completions", {"messages": HI, "max_tokens": 4})  # warm
    idle = rss_bytes(engine.proc.pid)
    content = b"word " * (16 * 2**20 // 5)  # 16 MiB
    big = b'{"messages": [{"role": "user", "content": "' + content + b'"}]}'
    small = {"messages": HI, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    results, peak = {}, PeakRss(engine.proc.pid)
    peak.start()
    threads = [threading.Thread(target=timed, args=(results, "big", lambda: post(
                   engine.sock, "/v1/chat/completions", big, timeout=60))),
               threading.Thread(target=timed, args=(results, "small", lambda: post(
                   engine.sock, "/v1/chat/completions", small, timeout=60)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    peak.is_done = True
    peak.join()
    print(f"refused in {results['big_s']:.2f} s, small answered in {results['small_s']:.2f} s, "
          f"RSS {idle / 1e6:.0f} MB idle, {peak.peak / 1e6:.0f} MB peak")
    assert results["big"].status == 400
    assert results["big"].json()["error"]["code"] == "context_length_exceeded"
    assert results["big_s"] < 3.0
    assert results["small"].status == 200 and results["small_s"] < 3.0
    assert peak.peak - idle <= 100e6


def test_tokenize_is_bounded_the_same_way(engine):
    text = "word " * (16 * 2**20 // 5)
    for body in ({"prompt": text}, {"messages": [{"role": "user", "content": text}]}):
        start = time.monotonic()
        resp = post(engine.sock, "/tokenize", body, timeout=60)
        assert resp.status == 400 and time.monotonic() - start < 3.0
        assert resp.json()["error"]["code"] == "context_length_exceeded"
    fits = post(engine.sock, "/tokenize", {"prompt": "word " * 200}).json()
    assert fits["count"] <= MAX_CONTEXT


def test_a_prompt_that_just_fits_is_served(engine):
    """Near the edge the floor from the text's size says nothing; the real count decides."""
    ids = post(engine.sock, "/tokenize", {"messages": [{"role": "user", "content": "x"}]}).json()
    room = MAX_CONTEXT - ids["count"] - 1
    content = "x" + " a" * room  # one token per " a"
    count = post(engine.sock, "/tokenize", {"messages": [{"role": "user", "content": content}]})
    assert count.json()["count"] == MAX_CONTEXT - 1
    resp = post(engine.sock, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": content}], "max_tokens": 1})
    assert resp.status == 200, resp.body
    over = post(engine.sock, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": content + " a a"}], "max_tokens": 1})
    assert over.status == 400 and over.json()["error"]["code"] == "context_length_exceeded"
