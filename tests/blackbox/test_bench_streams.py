"""bench/common.py's stream_text_times, the decode rate of bench/decode.py, ab_engine.py and
agent_turns.py, against a canned stream on a Unix socket: it counts tokens, not chunks (a
chunk carries a step's tokens, a speculating step's accepted drafts too)."""
import http.server
import importlib.util
import json
import shutil
import socketserver
import threading

from tests.support.bench import BENCH
from tests.support.engine import short_tmpdir

# the prefill's token; a verify step's 4; a step whose token waits for the rest of its
# character (ids, no text yet); then one more token; then the usage chunk (no ids)
CHUNKS = [{"text": "Hi", "token_ids": [1]}, {"text": " there,", "token_ids": [2, 3, 4, 5]},
          {"text": "", "token_ids": [6]}, {"text": "é", "token_ids": [7]}, {"text": ""}]


class Canned(http.server.BaseHTTPRequestHandler):
    bodies: list = []
    chunks: list = CHUNKS

    def do_POST(self):
        Canned.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for chunk in Canned.chunks:
            self.wfile.write(b"data: " + json.dumps({"choices": [chunk]}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


class UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    def get_request(self):
        request, _ = super().get_request()
        return request, ("unix", 0)  # BaseHTTPRequestHandler wants a (host, port)


def stream_times(chunks: list) -> tuple:
    spec = importlib.util.spec_from_file_location("bench_common_streams", BENCH / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    Canned.chunks = chunks
    tmp = short_tmpdir()
    server = UnixHTTP(f"{tmp}/canned.sock", Canned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        return common.stream_text_times(f"{tmp}/canned.sock", [5, 6], 8)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp)


def test_a_chunk_of_several_tokens_counts_each():
    first, last, count = stream_times(CHUNKS)
    assert count == 1 + 4 + 1 + 1  # the first chunk as one, then every token after it
    assert first <= last
    assert Canned.bodies[-1]["return_token_ids"] is True and Canned.bodies[-1]["stream"] is True


def test_an_engine_without_token_ids_is_counted_by_text_chunk():
    """ab_engine.py's --base may predate return_token_ids: its chunks then count one each."""
    first, last, count = stream_times([{"text": "a"}, {"text": "b"}, {"text": ""}, {"text": "c"}])
    assert count == 3 and first <= last


def test_ab_engine_prompts_a_synthetic_model_inside_its_vocabulary(monkeypatch):
    """--model synthetic:NAME (random weights): as many fixed ids as the prefill asks, all
    in the vocabulary and not one token repeated; the default model's text repeated to length."""
    import sys
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "ab_engine", raising=False)
    import ab_engine
    from engined.weights import synthetic

    ids = ab_engine.model_tokens("synthetic:small", 2048)
    vocab = synthetic.config_of("synthetic:small")["vocab_size"]
    assert len(ids) == 2048 and all(0 < i < vocab for i in ids)
    assert ids == ab_engine.model_tokens("synthetic:small", 2048) and len(set(ids[:64])) == 64
    text = ab_engine.model_tokens("default", 2000)
    assert len(text) == 2000 and text[:600] == ab_engine.model_tokens("default", 600)
