"""The tiny Kimi-Linear checkpoint served by the real engine, App and HTTP server over a Unix
socket (in process): greedy output over HTTP equals the model's own greedy loop."""
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import kimi_tiny  # noqa: E402
from engine_helpers import InProcessEngine, post, stream  # noqa: E402

from engined.kimi_checkpoint import load_kimi_linear  # noqa: E402

ASK = [{"role": "user", "content": "hello world, the weather in Paris?"}]
NEW = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "tiny")
    loaded = load_kimi_linear(path, progress=False)
    with InProcessEngine(loaded.model, loaded.tokenizer, loaded.chat) as engine:
        yield engine, loaded


def greedy_text(loaded) -> tuple[str, int]:
    """Direct greedy loop on the model: (text until a stop id or NEW tokens, prompt length)."""
    model, tok, chat = loaded.model, loaded.tokenizer, loaded.chat
    ids = tok.encode(chat.render(ASK))
    cache = model.new_cache(len(ids) + NEW + 1)
    logits, out = model.forward(torch.tensor(ids), cache, 0), []
    for i in range(NEW):
        nxt = int(logits[-1].argmax())
        if nxt in chat.stop_token_ids:
            break
        out.append(nxt)
        logits = model.forward(torch.tensor([nxt]), cache, len(ids) + i)
    return tok.decode(out), len(ids)


def test_chat_completion_equals_direct_greedy_decode(served):
    engine, loaded = served
    want, prompt_len = greedy_text(loaded)
    assert want                                  # the tiny model does generate before any stop id
    resp = post(engine.sock, "/v1/chat/completions",
                {"messages": ASK, "max_tokens": NEW, "temperature": 0}, timeout=60)
    assert resp.status == 200, resp.body
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == want
    assert body["usage"]["prompt_tokens"] == prompt_len


def test_streamed_chat_equals_direct_greedy_decode(served):
    engine, loaded = served
    want, _ = greedy_text(loaded)
    events = stream(engine.sock, "/v1/chat/completions",
                    {"messages": ASK, "max_tokens": NEW, "temperature": 0, "stream": True}, timeout=60)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if isinstance(e, dict) and e.get("choices"))
    assert text == want
