"""App-level behaviour: keep-alives, restart restoration, count_tokens, models, metrics,
recording, input translation details and config layering."""
import json
import os
import stat

import pytest

from proxy import config, sse
from proxy.app import create_app
from proxy.cassettes.replay import load, replay, unexplained
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config, serve_app

ANTH = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def make(tmp_path, *replies, **cfg):
    fake = FakeUpstream(*replies)
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path, **cfg))
    app.extensions["kimi"].upstream = fake.client()
    return app, fake


def test_anthropic_pings_while_the_upstream_is_quiet(tmp_path):
    fake = FakeUpstream(Reply.text("late", delay_s=0.45, size=4))
    with fake.serve() as url:
        app = create_app(proxy_config(url, tmp_path, PING_INTERVAL_S=0.1))
        frames = sse.parse_frames(app.test_client().post("/v1/messages", json={**ANTH, "stream": True}).get_data())
    events = [e for e, _d in frames]
    assert events[:2] == ["message_start", "ping"]
    first_block = events.index("content_block_start")
    assert events[2:first_block].count("ping") >= 2  # periodic, before the first token
    assert events[-2:] == ["message_delta", "message_stop"]


def test_chat_keepalive_is_an_sse_comment(tmp_path):
    fake = FakeUpstream(Reply.text("late", delay_s=0.35))
    with fake.serve() as url:
        app = create_app(proxy_config(url, tmp_path, PING_INTERVAL_S=0.1))
        raw = app.test_client().post("/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).get_data()
    assert sse.COMMENT_KEEPALIVE in raw and raw.endswith(b"data: [DONE]\n\n")


def test_restart_restores_reasoning_and_raw_arguments(tmp_path):
    args = '{"path":  "a.txt"}'
    reply = Reply.tools([("call_7", "read", args)])
    reply.deltas.insert(0, {"reasoning_content": "Read the file first."})
    app1, _fake1 = make(tmp_path, reply)
    tools = [{"name": "read", "input_schema": {"type": "object"}}]
    first = app1.test_client().post("/v1/messages", json={**ANTH, "tools": tools}).get_json()
    app1.extensions["kimi"].close()
    app2, fake2 = make(tmp_path, Reply.text("done"))  # same ledger file: a restarted proxy
    thinking, use = first["content"][0], first["content"][-1]
    echoed = [{"type": "thinking", "thinking": "", "signature": thinking["signature"]}, use]  # text dropped
    body = {**ANTH, "tools": tools, "messages": ANTH["messages"] + [
        {"role": "assistant", "content": echoed},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "x"}]}]}
    assert app2.test_client().post("/v1/messages", json=body).status_code == 200
    sent = fake2.requests[-1]["messages"][1]
    assert sent["reasoning_content"] == "Read the file first."
    assert sent["tool_calls"][0]["function"]["arguments"] == args and sent["tool_calls"][0]["id"] == "call_7"


def test_count_tokens_real_and_estimated(tmp_path, caplog):
    app, fake = make(tmp_path)
    body = {**ANTH, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}
    assert app.test_client().post("/v1/messages/count_tokens", json=body).get_json() == {"input_tokens": 42}
    fake.has_tokenize = False
    got = app.test_client().post("/v1/messages/count_tokens", json=body).get_json()
    assert set(got) == {"input_tokens"} and got["input_tokens"] >= 1
    assert "ESTIMATE" in caplog.text


def test_models_in_the_callers_shape(tmp_path):
    app, _ = make(tmp_path, MODEL="kimi-linear")
    client = app.test_client()
    anth = client.get("/v1/models", headers={"anthropic-version": "2023-06-01"}).get_json()
    assert anth["data"][0] == {"type": "model", "id": "kimi-linear", "display_name": "kimi-linear",
                               "created_at": "1970-01-01T00:00:00Z"} and anth["has_more"] is False
    oa = client.get("/v1/models").get_json()
    assert oa["object"] == "list" and oa["data"][0]["id"] == "kimi-linear" and oa["data"][0]["object"] == "model"
    assert client.head("/").status_code == 200 and client.get("/health").get_json()["status"] == "ok"


def test_metrics_count_requests_and_parse_failures(tmp_path):
    bad = Reply.text('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    app, _ = make(tmp_path, bad, TOOL_PARSER="hermes")
    client = app.test_client()
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    with client.post("/v1/chat/completions", json=body) as reply:  # counted once written
        assert reply.status_code == 200
    client.post("/v1/chat/completions", json={**body, "stream": True}).get_data()
    text = client.get("/metrics").get_data(as_text=True)
    assert 'kimi_proxy_ttft_seconds_count{route="chat"} 1.0' in text
    assert 'kimi_proxy_upstream_seconds_count{route="chat"} 2.0' in text
    assert 'kimi_proxy_requests_total{preset="openai-sdk",route="chat",status="200"} 2.0' in text
    assert 'kimi_proxy_tool_parse_failures_total{parser="hermes"} 2.0' in text


def test_record_writes_private_cassettes_that_replay(tmp_path):
    rec = tmp_path / "rec"
    reply = Reply.text("hello", reasoning="r")
    app, _ = make(tmp_path, reply, RECORD=str(rec))
    resp = app.test_client().post("/v1/messages", json={**ANTH, "stream": True},
                                  headers={"x-api-key": "secret-key", "user-agent": "claude-cli/2.1 (external)"})
    resp.get_data()
    app.extensions["kimi"].recorder.flush()
    files = list(rec.iterdir())
    assert len(files) == 1 and stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
    cassette = load(files[0])
    assert "secret-key" not in files[0].read_text() and cassette["request"]["headers"]["x-api-key"] == "<redacted>"
    assert cassette["preset"] == "claude-code" and cassette["upstream"]["chunks"]
    assert cassette["proxy_config"]["TOOL_PARSER"] == "auto"
    result = replay(cassette)  # with the configuration it was recorded under
    assert unexplained(result, []) == []


def test_input_translation_details(tmp_path):
    app, fake = make(tmp_path, Reply.text("ok"))
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    body = {**ANTH, "system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, img]},
                         {"role": "system", "content": "mid-conversation note"},
                         {"role": "user", "content": "go"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "tool", "name": "f"}, "top_k": 5}
    assert app.test_client().post("/v1/messages", json=body).status_code == 200
    sent = fake.requests[-1]
    assert sent["messages"][0] == {"role": "system", "content": "S1\n\nS2"}
    assert sent["messages"][1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert sent["messages"][2] == {"role": "system", "content": "mid-conversation note"}
    assert [t["function"]["name"] for t in sent["tools"]] == ["f"]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "f"}} and sent["top_k"] == 5


def test_responses_custom_and_namespace_tools(tmp_path):
    reply = Reply.tools([("c1", "apply_patch", '{"input": "*** Begin Patch\\n"}'), ("c2", "spawn_agent", "{}")])
    app, fake = make(tmp_path, reply)
    tools = [{"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark",
                                                                  "definition": "start: x"}},
             {"type": "namespace", "name": "multi_agent_v1", "tools": [
                 {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
             {"type": "web_search"}]
    out = app.test_client().post("/v1/responses", json={"model": "m", "input": "hi", "tools": tools}).get_json()
    assert [t["function"]["name"] for t in fake.requests[-1]["tools"]] == ["apply_patch", "spawn_agent"]
    custom, call = out["output"]
    assert custom["type"] == "custom_tool_call" and custom["input"] == "*** Begin Patch\n"
    assert call["type"] == "function_call" and call["namespace"] == "multi_agent_v1"
    turn2 = [{"role": "user", "content": "hi"}, {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
                                                  "input": "*** Begin Patch\n"},
             {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"}]
    app.test_client().post("/v1/responses", json={"model": "m", "input": turn2, "tools": tools})
    sent = fake.requests[-1]["messages"]
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"input": "*** Begin Patch\n"}
    assert sent[2] == {"role": "tool", "tool_call_id": "c1", "content": "Done"}


def test_config_layering_and_errors(tmp_path):
    path = tmp_path / "proxy.toml"
    path.write_text('port = 9001\nmodel = "from-file"\nmodel-alias = ["a=b"]\n')
    env = {"KIMI_PROXY_PORT": "9002", "KIMI_PROXY_MODEL": "from-env"}
    cfg = config.load({"MODEL": "from-cli", "LEDGER": str(tmp_path / "l")}, str(path), env)
    assert (cfg["PORT"], cfg["MODEL"], cfg["MODEL_ALIAS"]) == (9002, "from-cli", {"a": "b"})
    assert config.load({}, str(path), {})["PORT"] == 9001
    assert config.load({}, None, {"XDG_RUNTIME_DIR": "/run/user/5"})["UPSTREAM"] == \
        "unix:///run/user/5/kimi/engine.sock"
    assert config.load({}, None, {"RUNTIME_DIRECTORY": "/run/kimi"})["UPSTREAM"] == "unix:///run/kimi/engine.sock"
    for bad, message in [({"REASONING_FIELD": "x"}, "reasoning-field"), ({"TOOL_PARSER": "nope"}, "tool-parser"),
                         ({"CLIENT": "nope"}, "unknown client"), ({"UPSTREAM": "ftp://x"}, "upstream"),
                         ({"PORT": "abc"}, "port"), ({"MODEL_ALIAS": ["bad"]}, "A=B")]:
        with pytest.raises(config.ConfigError, match=message):
            config.load(bad, None, {})
    path.write_text("bogus = 1\n")
    with pytest.raises(config.ConfigError, match="unknown key 'bogus'"):
        config.load({}, str(path), {})


def test_model_alias_and_client_model_echo(tmp_path):
    app, fake = make(tmp_path, Reply.text("ok"), MODEL_ALIAS=["claude-haiku=small-one"], MODEL="big-one")
    out = app.test_client().post("/v1/messages", json={**ANTH, "model": "claude-haiku"}).get_json()
    assert fake.requests[-1]["model"] == "small-one" and out["model"] == "claude-haiku"
    app.test_client().post("/v1/messages", json={**ANTH, "model": "claude-opus"})
    assert fake.requests[-1]["model"] == "big-one"


def test_real_socket_streams_are_forwarded_per_chunk(tmp_path):
    fake = FakeUpstream(Reply.text("abcdef", size=1, delay_s=0.15))
    with fake.serve() as url, serve_app(create_app(proxy_config(url, tmp_path))) as base:
        import http.client
        import time
        conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=10)
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        arrivals, dec = [], sse.Decoder()
        while True:
            data = resp.read1(65536)
            if not data:
                break
            for _e, payload in dec.feed(data):
                if '"content":"' in payload and '"role"' not in payload:
                    arrivals.append(time.monotonic())
        conn.close()
    assert len(arrivals) == 6
    assert arrivals[-1] - arrivals[0] >= 0.5  # each letter arrived on its own, not coalesced at the end


def test_unix_socket_upstream(tmp_path):
    fake = FakeUpstream(Reply.text("over the socket", reasoning="r"))
    with fake.serve_unix(str(tmp_path / "engine.sock")) as url:
        app = create_app(proxy_config(url, tmp_path))
        client = app.test_client()
        out = client.post("/v1/messages", json=ANTH).get_json()
        frames = sse.parse_frames(client.post("/v1/messages", json={**ANTH, "stream": True}).get_data())
        count = client.post("/v1/messages/count_tokens", json=ANTH).get_json()
        assert client.get("/health").get_json()["status"] == "ok"
    assert out["content"][-1]["text"] == "over the socket"
    assert [e for e, _d in frames][-1] == "message_stop" and count == {"input_tokens": 42}


def test_upstream_that_ignores_stream_true(tmp_path):
    from proxy.upstream.client import Upstream

    fake = FakeUpstream(Reply.text("plain json", reasoning="r"))
    fake.is_json_only = True
    with fake.serve() as url:
        stream = Upstream(url).open_stream({"model": "m", "stream": True, "messages": []})
        chunks = list(stream)
    assert chunks[0]["choices"][0]["delta"] == {"reasoning_content": "r"}
    assert chunks[1]["choices"][0]["delta"] == {"content": "plain json"}


def test_structured_output_becomes_response_format(tmp_path):
    app, fake = make(tmp_path, Reply.text('{"a": 1}'))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    app.test_client().post("/v1/responses", json={"model": "m", "input": "x", "text": {
        "format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}})
    assert fake.requests[-1]["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "thing", "schema": schema, "strict": True}}
    app.test_client().post("/v1/messages", json={**ANTH, "output_format": {"type": "json_schema", "schema": schema}})
    assert fake.requests[-1]["response_format"]["json_schema"]["schema"] == schema
    app.test_client().post("/v1/responses", json={"model": "m", "input": "x", "text": {"verbosity": "low"}})
    assert "response_format" not in fake.requests[-1] and "text" not in fake.requests[-1]


def test_stale_pooled_connection_is_retried_once(tmp_path):
    import socket

    from proxy.upstream.client import Upstream
    fake = FakeUpstream(Reply.text("again"))
    with fake.serve() as url:
        upstream = Upstream(url)
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        assert upstream.chat(body)["choices"][0]["message"]["content"] == "again"
        assert len(upstream._idle) == 1
        stale, peer = socket.socketpair()
        peer.close()  # the server dropped this keep-alive connection
        upstream._idle[0].sock = stale
        assert upstream.chat(body)["choices"][0]["message"]["content"] == "again"
        assert len(fake.requests) == 2


def test_the_shipped_example_config_loads_with_every_key(tmp_path):
    import pathlib
    import re
    example = pathlib.Path(__file__).resolve().parents[2] / "etc" / "proxy.toml"
    if not example.exists():
        pytest.skip("etc/proxy.toml is not in this checkout")
    text = re.sub(r"^# ([a-z-]+ = .*?)([ \t]+#.*)?$", r"\1", example.read_text(), flags=re.M)
    text = text.replace('engine-user = "kimi"', 'engine-user = "root"')  # kimi: where installed
    path = tmp_path / "proxy.toml"
    path.write_text(text)
    cfg = config.load({}, str(path), {})
    assert cfg["UPSTREAM"] == "unix:///run/kimi/engine.sock" and cfg["API_KEY"] == "change-me"
    assert cfg["MODEL_ALIAS"] == {"claude-sonnet-4-5": "kimi-local"} and cfg["PORT"] == 8080 and cfg["ENGINE_USER"] == 0


def test_ledger_limits_come_from_config(tmp_path):
    from proxy.state import open_state

    cfg = config.load({"LEDGER": str(tmp_path / "l.sqlite")}, None,
                      {"KIMI_PROXY_LEDGER_MAX_ENTRIES": "7", "KIMI_PROXY_LEDGER_TTL_S": "60",
                       "KIMI_PROXY_RESPONSES_MAX_ENTRIES": "3"})
    reasoning, responses = open_state(cfg)
    assert (reasoning.ledger.max_entries, reasoning.ledger.ttl_seconds) == (7, 60.0)
    assert (responses.store.max_entries, responses.store.ttl_seconds) == (3, 60.0)
    with pytest.raises(config.ConfigError, match="ledger-max-entries must be positive"):
        config.load({"LEDGER_MAX_ENTRIES": 0}, None, {})


def test_hosted_tools_are_left_out_with_a_log_line_and_a_metric(tmp_path, caplog):
    app, fake = make(tmp_path, Reply.text("ok"), Reply.text("ok"))
    client = app.test_client()
    anth = {**ANTH, "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                              {"name": "Bash", "input_schema": {"type": "object"}}]}
    with caplog.at_level("INFO", logger="kimi.proxy"):
        assert client.post("/v1/messages", json=anth).status_code == 200
        resp = {"model": "m", "input": "hi", "tools": [
            {"type": "image_generation"}, {"type": "function", "name": "f", "parameters": {}}]}
        assert client.post("/v1/responses", json=resp).status_code == 200
    assert [t["function"]["name"] for t in fake.requests[0]["tools"]] == ["Bash"]
    assert [t["function"]["name"] for t in fake.requests[1]["tools"]] == ["f"]
    assert "web_search_20250305" in caplog.text and "image_generation" in caplog.text
    text = client.get("/metrics").get_data(as_text=True)
    assert 'kimi_proxy_dropped_tools_total{dialect="anthropic",type="web_search_20250305"} 1.0' in text
    assert 'kimi_proxy_dropped_tools_total{dialect="openai_responses",type="image_generation"} 1.0' in text
