"""Responses fields that were consumed and dropped unseen (tried as a new user would):
- `top_logprobs` and `include: ["message.output_text.logprobs"]` now ask the upstream for
  logprobs, and the output_text parts, deltas and done events carry them (read back through
  the official openai SDK's own event types);
- `conversation` and `prompt` name objects kept at OpenAI: answering without them answered
  another request, so they are a 400 naming the field."""
import openai
import pytest

from proxy.app import create_app
from tests.support.proxy_fakes import LOGPROBS, FakeUpstream, Reply, proxy_config, serve_app


def entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()),
            "top_logprobs": [{"token": token, "logprob": logprob, "bytes": list(token.encode())}]}


TOKENS = [("Hel", -0.5), ("lo", -0.25), (" there", -1.0)]
REPLY = Reply([{"content": t, LOGPROBS: [entry(t, lp)]} for t, lp in TOKENS])


@pytest.fixture
def stack(tmp_path):
    fake = FakeUpstream(REPLY)
    with fake.serve() as upstream_url:
        app = create_app(proxy_config(upstream_url, tmp_path))
        with serve_app(app) as base:
            yield fake, openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=10)


def test_top_logprobs_come_back_on_the_output_text(stack):
    fake, client = stack
    out = client.responses.create(model="m", input="hi", top_logprobs=1)
    assert fake.requests[-1]["logprobs"] is True and fake.requests[-1]["top_logprobs"] == 1
    part = out.output[0].content[0]
    assert part.text == "Hello there"
    assert [(lp.token, lp.logprob) for lp in part.logprobs] == TOKENS
    assert part.logprobs[2].top_logprobs[0].token == " there"


def test_streamed_deltas_carry_their_own_tokens_logprobs(stack):
    fake, client = stack
    events = list(client.responses.create(model="m", input="hi", stream=True,
                                          include=["message.output_text.logprobs"]))
    assert fake.requests[-1]["logprobs"] is True and fake.requests[-1]["top_logprobs"] == 0
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [(e.delta, [(lp.token, lp.logprob) for lp in e.logprobs]) for e in deltas] == \
        [(t, [(t, lp)]) for t, lp in TOKENS]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.token for lp in done.logprobs] == [t for t, _ in TOKENS]
    final = events[-1].response.output[0].content[0]
    assert [lp.logprob for lp in final.logprobs] == [lp for _, lp in TOKENS]


def test_a_whole_reply_gives_its_text_only_its_own_tokens(stack):
    """The upstream's logprobs of a whole reply also cover its reasoning's and its tool call's
    tokens; the output_text gets the run that spells its text, as the stream's deltas do."""
    fake, client = stack
    fake.script = [Reply([{"reasoning_content": "hmm", LOGPROBS: [entry("hmm", -2.0)]},
                          *REPLY.deltas,
                          {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                           "function": {"name": "ls", "arguments": "{}"}}],
                           LOGPROBS: [entry("<call>", -0.1)]}], finish="tool_calls")]
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
    out = client.responses.create(model="m", input="hi", top_logprobs=0, tools=tools)
    message = next(item for item in out.output if item.type == "message")
    assert [(lp.token, lp.logprob) for lp in message.content[0].logprobs] == TOKENS


def test_text_sent_before_a_failure_still_arrives(stack):
    fake, client = stack
    fake.script = [Reply([{"content": "AAA"}, {"content": "BBB"}], die_after=3)]
    deltas = []
    with pytest.raises(Exception):
        for event in client.responses.create(model="m", input="hi", stream=True, top_logprobs=0):
            deltas += [event.delta] if event.type == "response.output_text.delta" else []
            if event.type in ("error", "response.failed"):
                raise RuntimeError(event.type)
    assert deltas == ["AAA", "BBB"]


def test_without_asking_nothing_changes(stack):
    fake, client = stack
    out = client.responses.create(model="m", input="hi")
    assert "logprobs" not in fake.requests[-1] and out.output[0].content[0].logprobs is None


@pytest.mark.parametrize("field,value", [("conversation", "conv_123"), ("conversation", {"id": "conv_1"}),
                                         ("prompt", {"id": "pmpt_1"}), ("top_logprobs", 21),
                                         ("top_logprobs", True)])
def test_fields_that_cannot_be_honoured_are_400s(stack, field, value):
    fake, client = stack
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", input="hi", extra_body={field: value})
    assert caught.value.body["param"] == field and not fake.requests


def test_a_stored_responses_input_items_are_listed(stack):
    """GET /v1/responses/{id}/input_items (the SDK's responses.input_items.list) was a 404."""
    fake, client = stack
    sent = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "one"},
            {"type": "message", "role": "user", "id": "msg_mine", "content": [{"type": "input_text", "text": "two"}]}]
    response = client.responses.create(model="m", input=sent)
    newest = client.responses.input_items.list(response.id)
    assert [item.content[0].text for item in newest.data] == ["two", "one", "Be brief."]  # desc
    assert newest.data[0].id == "msg_mine" and not newest.has_more
    oldest = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [item.content[0].text for item in oldest.data] == ["Be brief.", "one"] and oldest.has_more
    rest = client.responses.input_items.list(response.id, order="asc", after=oldest.last_id)
    assert [item.id for item in rest.data] == ["msg_mine"]
    assert oldest.first_id == client.responses.input_items.list(response.id, order="asc").first_id  # stable
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(response.id, limit=500)


def test_input_items_of_every_shape_list_as_messages(stack):
    fake, client = stack
    sent = ["a bare string", {"role": "user", "content": [{"type": "input_text", "text": "untyped"}]},
            {"type": "message", "role": "assistant", "id": None, "content": "said"}]
    response = client.responses.create(model="m", input=sent)
    items = client.responses.input_items.list(response.id, order="asc").data
    assert [(item.type, item.content[0].text) for item in items] == [
        ("message", "a bare string"), ("message", "untyped"), ("message", "said")]
    assert all(item.id for item in items) and items[2].content[0].annotations == []
    for limit in ("\u00b2", "1" * 5000, "0", "1.5"):
        with pytest.raises(openai.BadRequestError):
            client.responses.input_items.list(response.id, extra_query={"limit": limit})
