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
    assert text == want and not text.lstrip().startswith(PREFILL)   # not a new reply


@pytest.mark.parametrize("final", [">", "Sure:\n", "```json\n", "<"])
def test_the_cut_is_at_the_final_texts_end_whatever_else_holds_it(engine, llama, final):
    """Text that the template's markup or an earlier message also holds: searching the
    rendered prompt for it cut at the wrong one (">" closed the turn, a text ending in "\n"
    too, "```json\n" cut inside the question that shows one). The reference: the question's prompt with its
    generation prompt, plus the text."""
    question = {"role": "user", "content": "Show a JSON example like:\n```json\n{}\n```"}
    head = post(engine.sock, "/tokenize", {"messages": [question]}).json()["tokens"]
    ids = post(engine.sock, "/tokenize", {"messages": [question, {"role": "assistant", "content": final}],
                                          "continue_final_message": True}).json()["tokens"]
    assert llama.tokenizer.decode(ids) == llama.tokenizer.decode(head) + final


@pytest.mark.parametrize("final", [{"role": "assistant", "content": "  \n"},
                                   {"role": "assistant", "content": "Calling", "tool_calls": [{
                                       "id": "c1", "type": "function",
                                       "function": {"name": "f", "arguments": "{}"}}]}])
def test_nothing_to_continue_is_a_400(engine, final):
    resp = post(engine.sock, "/v1/chat/completions", {"messages": [QUESTION, final], "max_tokens": 4,
                                                       "continue_final_message": True})
    assert resp.status == 400 and "continue_final_message" in resp.json()["error"]["message"]


def test_a_constrained_continuation_is_a_400(engine):
    """The grammar would start after the prefill: "{" then a whole JSON object is "{{"."""
    resp = chat(engine, continue_final_message=True, response_format={"type": "json_object"})
    assert resp.status == 400 and resp.json()["error"]["param"] == "continue_final_message"


def test_the_proxy_sends_the_clients_own_prefill_only_for_a_text_final_turn():
    """Anthropic's prefill maps to continue_final_message; a user or tool_use final turn
    does not. When continuing, the final message is the client's text even where the
    reasoning ledger holds the turn it cut short (restore would send that instead)."""
    from proxy.clients import policy
    from proxy.dialects import anthropic
    from proxy.upstream.payload import build_payload

    def parse(*messages):
        body = {"model": "m", "max_tokens": 8, "messages": list(messages)}
        return anthropic.parse_request(body, policy.resolve({}, "anthropic", "/v1/messages", {}, body))
    text = parse(QUESTION, {"role": "assistant", "content": PREFILL})
    assert text.passthrough == {"continue_final_message": True, "add_generation_prompt": False}
    assert parse(QUESTION).passthrough == {}
    tool = parse(QUESTION, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]})
    assert tool.passthrough == {}
    stored = {"role": "assistant", "content": PREFILL + " Paris, which"}
    payload = build_payload(text, model="m", reasoning_field="auto", restore=lambda m, i: stored)
    assert payload["messages"][-1]["content"] == PREFILL
    plain = build_payload(text.replace(passthrough={}), model="m", reasoning_field="auto",
                          restore=lambda m, i: stored)
    assert plain["messages"][-1] == stored               # without continuing, the ledger's turn
