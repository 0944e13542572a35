"""Generated bad bodies on every engine route (scripted model, real tokenizer and template):
always a 2xx or a 4xx in OpenAI's error shape, never a 500, streamed or not. The text
includes what valid JSON can carry but Unicode cannot: unpaired surrogate escapes."""
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.engine import InProcessEngine, ScriptedModel, get, post

ROUTES = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]
LONE = ["\ud800", "\udbff", "\udc00", "\udfff", "a\ud83d", "\ude00b"]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine(default_gguf, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "engine-cache"))
        from engined.chat import load_text

        tokenizer, chat = load_text(default_gguf)
    model = ScriptedModel(tokenizer.vocab_size, [tokenizer.token_to_id("<|im_end|>")])
    with InProcessEngine(model, tokenizer, chat) as engine:
        yield engine


texts = st.text(max_size=8) | st.builds(lambda a, s, b: a + s + b, st.text(max_size=4),
                                        st.sampled_from(LONE), st.text(max_size=4))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": texts}),
    min_size=1, max_size=3)
FIELDS = {"model": texts, "messages": messages | json_values, "prompt": texts | json_values,
          "tokens": json_values, "stop": texts | st.lists(texts, max_size=2),
          "stream": st.booleans(), "max_tokens": st.integers(1, 4), "tools": json_values,
          "tool_choice": texts | json_values, "return_token_strs": st.booleans(),
          "user": texts, "name": texts}
numbers = (st.integers(-2**40, 2**40) | st.integers(10**300, 10**320) | st.floats()
           | texts | st.none())
FIELDS.update({name: numbers for name in (  # the sampling fields: huge, NaN, inf, strings
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "temperature",
    "top_p", "min_tokens", "best_of")})
FIELDS.update({"logit_bias": st.dictionaries(texts | st.integers(0, 99).map(str), numbers,
                                             max_size=3) | json_values,
               "stop_token_ids": st.lists(numbers, max_size=2) | json_values,
               "continue_final_message": st.booleans() | json_values,
               "add_generation_prompt": st.booleans() | json_values,
               "include_stop_str_in_output": st.booleans() | json_values})
bodies = st.fixed_dictionaries({}, optional=FIELDS)


def assert_clean(resp):
    assert resp.status < 500, resp.body
    if resp.status >= 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and error["message"]
    elif resp.headers["content-type"].startswith("text/event-stream"):
        assert '"server_error"' not in resp.text, resp.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), body=bodies)
def test_generated_bodies_never_500(engine, route, body):
    assert_clean(post(engine.sock, route, json.dumps(body), timeout=30))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"model": "m\ud800", "messages": HI}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x\udfff"}]}),
    ("/v1/chat/completions", {"messages": HI, "stop": ["\ud800"]}),
    ("/v1/completions", {"prompt": "x\ud800y"}),
    ("/tokenize", {"prompt": "\udc00"}),
    ("/tokenize", {"messages": [{"role": "user", "content": "\udc00"}]}),
    ("/detokenize", {"tokens": [1], "model": "\ud800"}),
])
def test_unpaired_surrogates_are_400(engine, route, body, stream):
    resp = post(engine.sock, route, json.dumps({**body, "stream": stream}), timeout=30)
    assert resp.status == 400, resp.body
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and "surrogate" in error["message"]
    assert get(engine.sock, "/health").status == 200


@pytest.mark.parametrize("field", ["presence_penalty", "temperature", "min_p", "repetition_penalty"])
def test_numbers_past_a_float_are_400s_naming_the_field(engine, field):
    """10**400 fits JSON and a Python int, not a float: it was an OverflowError, a 500."""
    resp = post(engine.sock, "/v1/chat/completions",
                json.dumps({"messages": HI, field: 10**400}), timeout=30)
    assert resp.status == 400 and resp.json()["error"]["param"] == field, resp.body
    huge = post(engine.sock, "/v1/chat/completions",
                '{"messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field, "9" * 5000),
                timeout=30)      # past json's 4,300-digit limit: its ValueError was a 500
    assert huge.status == 400 and "not valid JSON" in huge.json()["error"]["message"], huge.body

