"""Issue 25: what a client controls at the proxy's surface. Its tool types become bounded
metric labels and escaped log lines; a body nested too deeply is a 400 in the route's shape;
allowed browser origins get CORS headers and a preflight answer."""
import pytest

from proxy.app import create_app
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

ANTH = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def make(tmp_path, **cfg):
    fake = FakeUpstream(Reply.text("ok"))
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path, **cfg))
    app.extensions["kimi"].upstream = fake.client()
    return app.test_client(), fake


# ---- tool types: metric labels and log lines -------------------------------------------
def test_unknown_tool_types_count_as_other_and_log_escaped(tmp_path, caplog):
    client, _fake = make(tmp_path)
    evil = 'x"} 1\r\nkimi_proxy_fake_total{a="' + "y" * 500
    tools = [{"type": evil, "name": "a"}, {"type": "web_search_20250305", "name": "web_search"},
             *({"type": f"made_up_{i}", "name": "b"} for i in range(20))]
    with caplog.at_level("INFO", logger="kimi.proxy"):
        assert client.post("/v1/messages", json={**ANTH, "tools": tools}).status_code == 200
    text = client.get("/metrics").get_data(as_text=True)
    assert 'kimi_proxy_dropped_tools_total{dialect="anthropic",type="other"} 21.0' in text
    assert 'kimi_proxy_dropped_tools_total{dialect="anthropic",type="web_search_20250305"} 1.0' in text
    assert "made_up" not in text and "kimi_proxy_fake" not in text
    line = next(r.getMessage() for r in caplog.records if "hosted tools left out" in r.getMessage())
    assert "\r" not in line and "\n" not in line and "\\r\\n" in line
    assert "y" * 20 in line and "y" * 40 not in line  # cut at 64 characters
    assert "made_up_5" in line and "made_up_6" not in line and "and 14 more" in line  # 8 shown


# ---- a body nested too deeply ----------------------------------------------------------
JSON_ROUTES = [("/v1/messages", "anthropic"), ("/v1/messages/count_tokens", "anthropic"),
               ("/v1/chat/completions", "openai"), ("/v1/responses", "openai"),
               ("/v1/responses/compact", "openai")]


def assert_too_deep(resp, shape: str):
    assert resp.status_code == 400, resp.get_data(as_text=True)
    body = resp.get_json()
    if shape == "anthropic":
        assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "request body is nested too deeply"}}
    else:
        assert body["error"]["type"] == "invalid_request_error" and "type" not in body
        assert body["error"]["message"] == "request body is nested too deeply"


@pytest.mark.parametrize("path,shape", JSON_ROUTES)
def test_deeply_nested_json_is_a_400_in_the_routes_shape(tmp_path, path, shape, caplog):
    client, fake = make(tmp_path)
    depth = 100_000
    raw = '{"model": "m", "max_tokens": 8, "input": "hi", "messages": [], "x": ' + "[" * depth + "]" * depth + "}"
    with caplog.at_level("WARNING", logger="kimi.proxy"):
        assert_too_deep(client.post(path, data=raw, content_type="application/json"), shape)
    assert "Traceback" not in caplog.text and not fake.requests


@pytest.mark.parametrize("path,shape", JSON_ROUTES)
def test_recursion_after_parsing_is_a_400_without_a_traceback(tmp_path, path, shape, caplog,
                                                             monkeypatch):
    """Nesting that parses may still be too deep for a later step (the payload, the policy):
    a RecursionError anywhere in the request is rendered at the edge as the client's 400."""
    def too_deep(*_args, **_kwargs):
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr("proxy.clients.policy.resolve", too_deep)
    client, fake = make(tmp_path)
    body = {**ANTH, "input": "hi"}
    with caplog.at_level("WARNING", logger="kimi.proxy"):
        assert_too_deep(client.post(path, json=body), shape)
    assert "Traceback" not in caplog.text and not fake.requests


# ---- CORS for allowed browser origins --------------------------------------------------
APP_ORIGIN = "http://localhost:3000"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions", "/v1/responses"])
def test_preflight_from_an_allowed_origin_is_answered_before_the_key(tmp_path, path):
    client, fake = make(tmp_path, ALLOW_ORIGIN=[APP_ORIGIN], API_KEY="k")
    asked = "content-type, x-api-key, anthropic-version, authorization"
    resp = client.options(path, headers={"Origin": APP_ORIGIN, "Access-Control-Request-Method": "POST",
                                         "Access-Control-Request-Headers": asked})
    assert resp.status_code == 204 and resp.get_data() == b""
    assert resp.headers["Access-Control-Allow-Origin"] == APP_ORIGIN
    assert "POST" in resp.headers["Access-Control-Allow-Methods"].split(", ")
    assert resp.headers["Access-Control-Allow-Headers"] == asked
    assert "Origin" in resp.headers["Vary"] and not fake.requests


def test_allowed_origin_reads_answers_and_errors(tmp_path):
    client, _fake = make(tmp_path, ALLOW_ORIGIN=[APP_ORIGIN], API_KEY="k")
    resp = client.post("/v1/messages", json=ANTH, headers={"Origin": APP_ORIGIN, "x-api-key": "k"})
    assert resp.status_code == 200 and resp.headers["Access-Control-Allow-Origin"] == APP_ORIGIN
    assert "X-Request-Id" in resp.headers["Access-Control-Expose-Headers"]
    assert "Origin" in resp.headers["Vary"]
    refused = client.post("/v1/messages", json=ANTH, headers={"Origin": APP_ORIGIN})  # no key
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Origin"] == APP_ORIGIN
    assert "Access-Control-Allow-Origin" not in client.get("/health").headers  # no Origin: no CORS
    assert "Origin" in client.get("/health").headers["Vary"]


def test_other_origins_get_no_cors_headers(tmp_path):
    client, _fake = make(tmp_path, ALLOW_ORIGIN=[APP_ORIGIN])
    evil = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    resp = client.options("/v1/messages", headers=evil)
    assert resp.status_code == 403 and "Access-Control-Allow-Origin" not in resp.headers
    odd = {"Origin": APP_ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "x-ok, bad header"}
    assert "Access-Control-Allow-Headers" not in client.options("/v1/messages", headers=odd).headers
    plain, _fake = make(tmp_path)  # no allow-origin: nothing changes for non-browser clients
    resp = plain.post("/v1/messages", json=ANTH)
    assert resp.status_code == 200 and "Vary" not in resp.headers
    assert not any(k.startswith("Access-Control-") for k in resp.headers.keys())
