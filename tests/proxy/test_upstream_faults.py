"""What other upstreams do: streams without `[DONE]`, 429s and context overflows with their
own kinds and Retry-After, and bodies whose text is not Unicode (issue 13, items 6, 7, 9)."""
import json

import pytest

from proxy import sse
from proxy.app import create_app
from tests.proxy.test_errors import VALID, assert_shape
from tests.support.engine import eventually
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

DIALECT_ROUTES = [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"),
                  ("/v1/responses", "openai")]


@pytest.fixture
def live(tmp_path):
    """The app with the real upstream client, in front of the fake upstream's HTTP server."""
    fake = FakeUpstream()
    with fake.serve() as url:
        yield fake, create_app(proxy_config(url, tmp_path)).test_client()


def frames_of(resp) -> list:
    return [(e, d if d == "[DONE]" else json.loads(d)) for e, d in sse.parse_frames(resp.get_data())]


def test_a_stream_without_done_ends_cleanly_in_every_dialect(live):
    fake, client = live
    fake.script = [Reply.text("Paris, of course.", has_done=False)]
    frames = frames_of(client.post("/v1/messages", json={**VALID["/v1/messages"], "stream": True}))
    assert [e for e, _d in frames[-2:]] == ["message_delta", "message_stop"], frames
    assert "error" not in [e for e, _d in frames]
    frames = frames_of(client.post("/v1/responses", json={**VALID["/v1/responses"], "stream": True}))
    assert frames[-1][0] == "response.completed", frames[-3:]
    assert frames[-1][1]["response"]["output"][-1]["content"][0]["text"] == "Paris, of course."
    frames = frames_of(client.post("/v1/chat/completions", json={**VALID["/v1/chat/completions"], "stream": True}))
    assert frames[-1] == (None, "[DONE]") and not any("error" in d for _e, d in frames[:-1])
    assert "".join(d["choices"][0]["delta"].get("content") or "" for _e, d in frames[:-1]
                   if d.get("choices")) == "Paris, of course."
    # the fake counts a stream once its last chunk is written, on its own thread: the client
    # can have read that chunk first (seen under make test's load)
    assert eventually(lambda: fake.completed == 3), fake.completed


def test_a_stream_that_ends_before_its_finish_reason_is_still_an_error(live):
    fake, client = live
    fake.script = [Reply.text("Par", has_done=False, usage=None, finish="")]
    frames = frames_of(client.post("/v1/chat/completions", json={**VALID["/v1/chat/completions"], "stream": True}))
    assert "error" in frames[-2][1]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,dialect", DIALECT_ROUTES)
def test_upstream_429_is_a_rate_limit_error_with_its_retry_after(live, route, dialect, stream):
    fake, client = live
    fake.script = [Reply(status=429, retry_after="17", error_code="rate_limit_exceeded")]
    resp = client.post(route, json={**VALID[route], "stream": stream})
    assert_shape(resp, dialect, 429)
    assert resp.headers["Retry-After"] == "17"
    error = resp.get_json()["error"]
    if dialect == "anthropic":
        assert error["type"] == "rate_limit_error"
    else:
        assert error["type"] == error["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,dialect", DIALECT_ROUTES)
def test_upstream_503_keeps_its_retry_after(live, route, dialect, stream):
    fake, client = live
    fake.script = [Reply(status=503, retry_after="30")]
    resp = client.post(route, json={**VALID[route], "stream": stream})
    assert_shape(resp, dialect, 503)
    assert resp.headers["Retry-After"] == "30"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,dialect", DIALECT_ROUTES)
def test_context_overflow_keeps_its_code_and_says_what_to_serve(live, route, dialect, stream):
    fake, client = live
    fake.max_model_len = 8192
    fake.script = [Reply(status=400, error_code="context_length_exceeded")]
    resp = client.post(route, json={**VALID[route], "stream": stream})
    assert_shape(resp, dialect, 400)
    error = resp.get_json()["error"]
    assert error["type"] == "invalid_request_error"
    if dialect == "openai":
        assert error["code"] == "context_length_exceeded"
    assert "8192 tokens" in error["message"] and "Kimi-Linear" in error["message"]
    assert "--upstream" in error["message"]


LONE = ['"\\ud800"', '"a\\udfffb"', '"\\udc00\\ud800"']


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,dialect", [*DIALECT_ROUTES, ("/v1/messages/count_tokens", "anthropic")])
def test_text_with_unpaired_surrogates_is_a_400_on_every_route(live, route, dialect, stream):
    fake, client = live
    base = {**VALID[route], "stream": stream}
    for lone in LONE:
        in_model = json.dumps(base).replace('"m"', lone, 1)
        text_key = '"hi"'
        in_text = json.dumps(base).replace(text_key, lone, 1)
        for raw in (in_model, in_text):
            resp = client.post(route, data=raw.encode(), content_type="application/json")
            assert_shape(resp, dialect, 400)
            assert "surrogate" in resp.get_json()["error"]["message"]
    paired = json.dumps(base).replace('"hi"', '"\\ud83d\\ude00"', 1)  # an emoji, escaped: fine
    assert client.post(route, data=paired.encode(), content_type="application/json").status_code == 200
