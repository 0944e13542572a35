"""Client detection against live captures, plus the ambiguous and forced cases."""
import gzip
import json
import pathlib

import pytest
from hypothesis import given, settings, strategies as st

from proxy.clients.detect import detect, normalize_headers, route_dialect, system_texts
from proxy.clients.presets import (ANTHROPIC, CHAT, PRESET_NAMES, RESPONSES, Preset, check_client_name,
                           fallback_preset, get_preset, setup_text)

CAPTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "live-clients"
CLIENT_OF_FILE = {"claude": "claude-code", "codex": "codex", "opencode": "opencode", "cline": "cline", "aider": "aider"}


def captured_requests():
    for path in sorted(CAPTURES.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            for n, line in enumerate(fh):
                record = json.loads(line)
                if record["method"] == "POST":
                    yield pytest.param(path.name.split("-")[0], record, id=f"{path.name}:{n}")


def test_every_client_has_captures():
    files = {p.name.split("-")[0] for p in CAPTURES.glob("*.jsonl.gz")}
    assert files == set(CLIENT_OF_FILE)


@pytest.mark.parametrize("prefix,record", list(captured_requests()))
def test_captured_request_is_detected_as_its_client(prefix, record):
    detection = detect(record["path"], record["headers"], record["body"])
    assert detection.client == CLIENT_OF_FILE[prefix], detection.reasons
    assert detection.dialect == route_dialect(record["path"])
    if prefix == "aider":
        # Same wire shape as the OpenAI SDK / LiteLLM: served by the route's generic preset.
        assert detection.preset == fallback_preset(detection.dialect)
        assert detection.preset.reasoning in ("reasoning_content", "thinking_blocks")
    else:
        assert detection.preset.name == CLIENT_OF_FILE[prefix] and not detection.is_fallback


def _aider_chat_capture():
    with gzip.open(CAPTURES / "aider-text.jsonl.gz", "rt") as fh:
        return json.loads(fh.readline())


def test_aider_and_openai_sdk_share_the_chat_fallback():
    aider = _aider_chat_capture()
    sdk_body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    as_aider = detect(aider["path"], aider["headers"], aider["body"])
    as_sdk = detect(aider["path"], aider["headers"], sdk_body)
    assert as_aider.preset is as_sdk.preset is get_preset("openai-sdk", CHAT)
    assert (as_aider.client, as_sdk.client) == ("aider", "openai-sdk")
    # Aider shows reasoning_content as THINKING and the OpenAI SDK ignores it: both served.
    assert as_sdk.preset.reasoning == "reasoning_content"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_litellm_clients_never_get_aider_only_behaviour(path):
    detection = detect(path, {"User-Agent": "litellm/1.81.10"}, {"model": "x", "messages": []})
    assert detection.preset.reasoning != "inline_tags" and detection.preset.name != "aider"
    named = detect("/v1/chat/completions", {"User-Agent": "Aider/0.60.0 litellm/1.48.0"}, {})
    assert named.preset.name == "aider" and named.preset.reasoning == "inline_tags"


@pytest.mark.parametrize("ua", ["OpenAI/Python 2.20.0", "curl/8.5.0", "python-requests/2.32", "Go-http-client/1.1", ""])
def test_plain_clients_resolve_to_the_sdk_presets(ua):
    body = {"messages": [{"role": "system", "content": "You are helpful."}], "tools": [], "stream": True}
    assert detect("/v1/chat/completions", {"user-agent": ua}, body).preset.name == "openai-sdk"
    assert detect("/v1/messages", {"user-agent": ua}, body).preset.name == "anthropic-sdk"
    assert detect("/v1/responses", {"user-agent": ua}, {"input": "hi"}).preset.name == "openai-sdk"


def test_body_keys_alone_never_win():
    body = {"system": "x", "max_tokens": 1, "thinking": {}, "context_management": {}, "input": [], "client_metadata": {}}
    assert detect("/v1/messages", {}, body).is_fallback
    assert detect("/v1/responses", {}, body).is_fallback


def test_codex_is_recognised_by_originator_alone_and_by_exec_user_agent():
    assert detect("/v1/responses", {"Originator": "codex_exec"}, {}).preset.name == "codex"
    ua = "codex_exec/0.145.0 (Ubuntu 24.4.0; x86_64) xterm (codex_exec; 0.145.0)"
    assert detect("/v1/responses", {"user-agent": ua}, {}).preset.name == "codex"


def test_claude_code_headers_without_user_agent():
    headers = {"x-app": "cli", "anthropic-beta": "interleaved-thinking-2025-05-14,claude-code-20250219"}
    detection = detect("/v1/messages?beta=true", headers, {})
    assert detection.preset.name == "claude-code" and "header x-app" in detection.reasons


def test_forced_preset_applies_only_to_its_own_dialect():
    claude = {"user-agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-app": "cli"}
    assert detect("/v1/messages", claude, {}, forced="codex").preset.name == "claude-code"
    forced = detect("/v1/responses", {}, {}, forced="codex")
    assert forced.is_forced and forced.preset.name == "codex" and forced.reasons == ("--client codex",)
    for path, dialect in (("/v1/messages", ANTHROPIC), ("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSES)):
        detection = detect(path, {}, {}, forced="opencode")
        assert detection.is_forced and detection.preset.dialect == dialect
    with pytest.raises(ValueError, match="claude-code"):
        check_client_name("nope")


def test_routes_headers_and_unknown_paths():
    assert route_dialect("/v1/messages?beta=true") == ANTHROPIC
    assert route_dialect("/messages") == ANTHROPIC
    assert route_dialect("/v1/responses/resp_123") == RESPONSES
    assert route_dialect("/v1/models", {"anthropic-version": "2023-06-01"}) == ANTHROPIC
    assert route_dialect("/v1/models", {}) == CHAT
    assert normalize_headers([("X-App", "cli"), ("x-app", "two")]) == {"x-app": "cli,two"}
    detection = detect("/nowhere", None, ["not", "a", "dict"])
    assert detection.is_fallback and detection.score == 0
    assert detect("/v1/models", {"Anthropic-Version": "2023-06-01", "User-Agent": "claude-cli/2"}, None).preset.name == "claude-code"


def test_system_texts_from_each_dialect():
    assert system_texts({"system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}) == ["A", "B"]
    assert system_texts({"messages": [{"role": "system", "content": "C"}]}) == ["C"]
    assert system_texts({"input": [{"role": "developer", "content": [{"type": "input_text", "text": "D"}]}]}) == ["D"]
    assert system_texts({"input": "plain string"}) == []


def test_preset_table_is_consistent():
    for dialect in (ANTHROPIC, CHAT, RESPONSES):
        assert fallback_preset(dialect).dialect == dialect
    assert {"claude-code", "codex", "opencode", "aider", "cline", "kimi-code", "openai-sdk", "anthropic-sdk"} <= set(PRESET_NAMES)
    assert get_preset("claude-code", CHAT) is None
    with pytest.raises(ValueError, match="invalid for chat"):
        Preset("x", CHAT, "thinking_blocks")
    text = setup_text("http://127.0.0.1:8080", "kimi-linear")
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:8080 " in text and "wire_api=responses" in text


def test_recorded_cassettes_keep_their_presets(shared_dir):
    renamed = {"openai": "openai-sdk"}
    for path in sorted((shared_dir / "fixtures" / "cassettes").glob("*.json.gz")):
        cassette = json.loads(gzip.decompress(path.read_bytes()))
        request = cassette["request"]
        detection = detect(request["path"], request["headers"], request["body"])
        assert detection.preset.name == renamed.get(cassette["preset"], cassette["preset"]), path.name


def test_sdk_headers_name_the_sdk_but_never_beat_a_client():
    stainless = {"x-stainless-lang": "python", "user-agent": "my-agent/1.0"}
    sdk = detect("/v1/chat/completions", stainless, {})
    assert sdk.preset.name == "openai-sdk" and not sdk.is_fallback and sdk.reasons == ("header x-stainless-lang",)
    kimi = detect("/v1/chat/completions", {**stainless, "user-agent": "KimiCLI/1.12.0"}, {})
    assert kimi.preset.name == "kimi-code" and kimi.preset.status == "provisional"


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                       max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(["/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/models", "/", "/x?y"]),
       headers=st.one_of(st.none(), st.integers(), st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=5),
                         st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), max_size=5)),
       body=JSONISH)
def test_detection_never_raises(path, headers, body):
    detection = detect(path, headers, body)
    assert detection.preset.dialect == detection.dialect
    messages = {"messages": [{"role": "system", "content": body}], "system": body, "input": [body]}
    assert detect(path, headers, messages).preset is not None



@pytest.mark.parametrize("prefix,record", list(captured_requests()))
def test_a_request_reads_as_its_header_list(prefix, record):
    """In the app, headers are werkzeug's EnvironHeaders, read straight from the WSGI environ."""
    from werkzeug.datastructures import EnvironHeaders
    from werkzeug.test import EnvironBuilder

    path = record["path"].split("?")[0]
    environ = EnvironBuilder(path=path, method="POST", headers=record["headers"]).get_environ()
    assert detect(path, EnvironHeaders(environ), record["body"]) == detect(path, record["headers"], record["body"])


def test_detection_is_memoised_on_what_it_reads():
    """A new session id (a header read only for its presence) or an unread header: no new work."""
    from proxy.clients.detect import _detect
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    first = detect("/v1/messages", {"User-Agent": "claude-cli/9.9", "X-Claude-Code-Session-Id": "a"}, body)
    misses = _detect.cache_info().misses
    again = detect("/v1/messages", {"user-agent": "claude-cli/9.9", "x-claude-code-session-id": "b", "x-other": "1"},
                   {**body, "temperature": 0.5})
    assert again is first and _detect.cache_info().misses == misses
    assert first.preset.name == "claude-code" and "header x-claude-code-session-id" in first.reasons
