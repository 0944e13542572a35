"""vLLM's continue_final_message (and add_generation_prompt) on chat requests, and the
Anthropic prefill the proxy maps onto it: the reply continues the final message's text
instead of starting a new turn. Both were ignored before: the model began a new reply that
restated the prefill."""
import pytest

from tests.support.engine import InProcessEngine, post

QUESTION = {"role": "user", "content": "What is the capital of France?"}
PREFILL = "The capital of France is"


@pytest.fixture(scope="module")
def engine(llama):
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=1024) as served:
        yield served


def chat(engine, **fields):
    return post(engine.sock, "/v1/chat/completions", {
        "messages": [QUESTION, {"role": "assistant", "content": PREFILL}], "max_tokens": 12,
        "temperature": 0, **fields})


def test_the_reply_continues_the_final_message_as_a_raw_prompt_would(engine, llama):
    """Reference: the prompt of the question alone with its generation prompt, plus the
    prefill's text, completed by /v1/completions (no chat rendering of the prefill)."""
    head = post(engine.sock, "/tokenize", {"messages": [QUESTION]}).json()["tokens"]
    prompt = llama.tokenizer.decode(head) + PREFILL
    want = post(engine.sock, "/v1/completions", {"prompt": prompt, "max_tokens": 12,
                                                 "temperature": 0}).json()["choices"][0]["text"]
    got = chat(engine, continue_final_message=True).json()["choices"][0]["message"]["content"]
    assert got == want and not got.lstrip().startswith(PREFILL)
    new_turn = chat(engine).json()["choices"][0]["message"]["content"]
    assert new_turn != got                                   # the default starts a new reply
    ids = post(engine.sock, "/tokenize", {"messages": [QUESTION, {"role": "assistant", "content": PREFILL}],
                                          "continue_final_message": True}).json()["tokens"]
    assert llama.tokenizer.decode(ids).endswith(PREFILL)


def test_contradicting_or_empty_requests_are_400s(engine):
    both = chat(engine, continue_final_message=True, add_generation_prompt=True)
    assert both.status == 400 and both.json()["error"]["param"] == "continue_final_message"
    empty = post(engine.sock, "/v1/chat/completions", {
        "messages": [QUESTION, {"role": "assistant", "content": ""}], "max_tokens": 4,
        "continue_final_message": True})
    assert empty.status == 400 and "continue_final_message" in empty.json()["error"]["message"]


def test_an_anthropic_prefill_through_the_proxy_is_continued(engine, tmp_path):
    from proxy.app import create_app
    from tests.support.proxy_fakes import proxy_config
    client = create_app(proxy_config(f"unix://{engine.sock}", tmp_path)).test_client()
    body = {"model": "m", "max_tokens": 12, "temperature": 0,
            "messages": [QUESTION, {"role": "assistant", "content": PREFILL}]}
    resp = client.post("/v1/messages", json=body)
    assert resp.status_code == 200, resp.get_data()
    text = "".join(b["text"] for b in resp.get_json()["content"] if b["type"] == "text")
    want = chat(engine, continue_final_message=True).json()["choices"][0]["message"]["content"]
    assert text == want
