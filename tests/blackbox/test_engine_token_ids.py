"""vLLM's token-id options on the real daemon (docs/engine-api.md): `return_token_ids` puts
prompt_token_ids and per-choice token_ids in the response, `return_tokens_as_token_ids`
writes logprob tokens as "token_id:N". Each id list is checked against an independent
path: /tokenize, /detokenize, and the logprob entries of the same greedy run."""
import shutil

import pytest

from tests.support.engine import Daemon, post, stream

HI = [{"role": "user", "content": "Count to five."}]


@pytest.fixture(scope="module")
def sock(tmp_path_factory):
    daemon = Daemon(tmp_path_factory.getbasetemp() / "engine-cache", "--max-context", "512").start()
    yield daemon.sock
    daemon.stop()
    shutil.rmtree(daemon.dir, ignore_errors=True)


def ids_of(entries: list[str]) -> list[int]:
    assert all(e.startswith("token_id:") for e in entries), entries
    return [int(e.split(":", 1)[1]) for e in entries]


def test_chat_returns_prompt_and_output_ids(sock):
    body = {"messages": HI, "max_tokens": 8, "temperature": 0, "return_token_ids": True,
            "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True}
    reply = post(sock, "/v1/chat/completions", body).json()
    choice = reply["choices"][0]
    assert reply["prompt_token_ids"] == post(sock, "/tokenize", {"messages": HI}).json()["tokens"]
    assert len(choice["token_ids"]) == reply["usage"]["completion_tokens"]
    content = choice["logprobs"]["content"]
    assert ids_of([e["token"] for e in content]) == choice["token_ids"][:len(content)]
    assert all(t["token"].startswith("token_id:") for e in content for t in e["top_logprobs"])
    if choice["finish_reason"] == "length":  # no stop token: the ids are exactly the text
        assert post(sock, "/detokenize", {"tokens": choice["token_ids"]}).json()["prompt"] == \
            choice["message"]["content"]


def test_chat_without_the_options_has_no_id_fields(sock):
    reply = post(sock, "/v1/chat/completions", {"messages": HI, "max_tokens": 4,
                                                "temperature": 0, "logprobs": True}).json()
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
    assert not reply["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")


def test_chat_stream_ids_add_up_to_the_whole(sock):
    body = {"messages": HI, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    whole = post(sock, "/v1/chat/completions", body).json()
    events = stream(sock, "/v1/chat/completions", {**body, "stream": True})
    chunks = [e for e in events if e != "[DONE]"]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    streamed = [i for c in chunks[1:] for i in c["choices"][0]["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"]


def test_completions_ids_on_the_choice(sock):
    prompt = post(sock, "/tokenize", {"prompt": "Once upon a time"}).json()["tokens"]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True}
    choice = post(sock, "/v1/completions", body).json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    assert ids_of(choice["logprobs"]["tokens"]) == choice["token_ids"]
    assert len(choice["token_ids"]) == 6
    assert post(sock, "/detokenize", {"tokens": choice["token_ids"]}).json()["prompt"] == choice["text"]
    offsets = choice["logprobs"]["text_offset"]  # offsets count text, not "token_id:N"
    assert offsets[-1] < len(choice["text"]) and offsets == sorted(offsets)
    events = stream(sock, "/v1/completions", {**body, "stream": True})
    chunks = [e for e in events if e != "[DONE]"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert [i for c in chunks for i in c["choices"][0]["token_ids"]] == choice["token_ids"]


@pytest.mark.parametrize("name", ["return_token_ids", "return_tokens_as_token_ids"])
def test_the_options_must_be_booleans(sock, name):
    resp = post(sock, "/v1/completions", {"prompt": "x", name: "yes"})
    assert resp.status == 400 and resp.json()["error"]["param"] == name
