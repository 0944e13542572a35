"""Content the model cannot read is never dropped unseen (tried as a new user would: an
Anthropic search_result block, a PDF document, a Responses input_file all vanished from the
prompt, and an image in a tool result made the text-only engine answer 400 on every later
turn, wedging Claude Code after it read a screenshot):
- what is text arrives as text (search results, documents with a content source);
- what cannot be read becomes text that says so, in place (canonical.left_out);
- for an upstream whose model card says its input is text alone (kimi-engine's
  input_modalities ["text"]), images become that text too; other upstreams get the images."""
import pytest

from proxy.app import create_app
from proxy.cassettes.replay import load, replay, unexplained
from tests.proxy.test_upstream_context import Server, proxy_for
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

ANTH = {"model": "m", "max_tokens": 8}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
PDF = {"type": "document", "title": "spec", "source": {"type": "base64", "media_type": "application/pdf",
                                                         "data": "JVBERi0="}}
SEARCH = {"type": "search_result", "source": "https://x/doc", "title": "Sky",
          "content": [{"type": "text", "text": "The sky is green."}]}
READ = [{"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]}]
TOOLS = [{"name": "Read", "input_schema": {"type": "object"}}]


@pytest.fixture
def stack(tmp_path):
    fake = FakeUpstream(Reply.text("ok"))
    with fake.serve() as url:
        yield fake, create_app(proxy_config(url, tmp_path)).test_client()


def sent_text(fake) -> str:
    """Every text the upstream got, with image parts as <image>."""
    out = []
    for m in fake.requests[-1]["messages"]:
        content = m["content"]
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content or ():
            out.append(part["text"] if part["type"] == "text" else f"<{part['type']}>")
    return "\n".join(out)


def test_anthropic_blocks_are_read_or_named(stack):
    fake, client = stack
    content = [SEARCH, PDF, {"type": "document", "source": {"type": "content", "content": [
        {"type": "text", "text": "Chapter one."}]}}, {"type": "container_upload", "file_id": "f"},
        {"type": "text", "text": "What colour is the sky?"}]
    resp = client.post("/v1/messages", json={**ANTH, "messages": [{"role": "user", "content": content}]},
                       headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    text = sent_text(fake)
    assert "Sky\nhttps://x/doc\nThe sky is green." in text and "Chapter one." in text
    assert '[document "spec" (application/pdf, source base64): left out' in text
    assert "['container_upload' block: left out" in text


def test_an_anthropic_tool_result_keeps_what_it_can(stack):
    fake, client = stack
    result = {"type": "tool_result", "tool_use_id": "toolu_1",
              "content": [{"type": "text", "text": "page 1"}, SEARCH, PDF, {"type": "image", "source": PNG}]}
    resp = client.post("/v1/messages", json={**ANTH, "tools": TOOLS, "messages": [
        *READ, {"role": "user", "content": [result]}]}, headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 200
    tool = next(m for m in fake.requests[-1]["messages"] if m["role"] == "tool")
    assert tool["content"].startswith("page 1\nSky\nhttps://x/doc\nThe sky is green.\n[document")
    assert "<image_url>" in sent_text(fake)  # the upstream may read images: it gets them


def test_a_text_only_upstream_gets_images_as_text(stack):
    fake, client = stack
    fake.input_modalities = ["text"]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image", "source": PNG}]}
    body = {**ANTH, "tools": TOOLS, "messages": [*READ, {"role": "user", "content": [result]},
                                                 {"role": "assistant", "content": "A logo."},
                                                 {"role": "user", "content": [{"type": "image", "source": PNG},
                                                                              {"type": "text", "text": "and this?"}]}]}
    resp = client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 200
    text = sent_text(fake)
    assert "<image_url>" not in text and text.count("[image (image/png): left out") == 2
    count = client.post("/v1/messages/count_tokens", json=body, headers={"anthropic-version": "2023-06-01"})
    assert count.status_code == 200 and "<image_url>" not in str(fake.requests[-1])


def test_chat_files_and_audio(stack):
    fake, client = stack
    content = [{"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}},
               {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
               {"type": "text", "text": "summarise"}]
    resp = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": content}]})
    assert resp.status_code == 200
    text = sent_text(fake)
    assert '[file "a.pdf": left out' in text and "[audio: left out" in text and "summarise" in text


def test_responses_files_and_tool_output_parts(stack):
    fake, client = stack
    items = [{"role": "user", "content": [{"type": "input_file", "filename": "a.pdf", "file_data": "x"},
                                          {"type": "input_image", "file_id": "file_1"},
                                          {"type": "input_text", "text": "summarise"}]},
             {"type": "function_call", "call_id": "c1", "name": "view", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": [
                 {"type": "input_text", "text": "shown:"},
                 {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                 {"type": "input_file", "filename": "b.pdf"}]}]
    resp = client.post("/v1/responses", json={"model": "m", "input": items, "tools": [
        {"type": "function", "name": "view", "parameters": {"type": "object"}}]})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    text = sent_text(fake)
    assert '[file "a.pdf": left out' in text and "[image (a file_id): left out" in text
    assert 'shown:\n[file "b.pdf": left out' in text and "<image_url>" in text


@pytest.mark.parametrize("block", [
    {"type": "search_result", "content": 5}, {"type": "search_result", "content": ["a", {"type": "x"}]},
    {"type": "document", "title": 3, "source": "x"}, {"type": "document", "source": {"type": "content", "content": [
        {"type": "image", "source": PNG}, "plain"]}}, {"type": 7}])
def test_odd_block_shapes_are_read_as_far_as_they_go(stack, block):
    fake, client = stack
    body = {**ANTH, "messages": [{"role": "user", "content": [block, {"type": "text", "text": "hi"}]}]}
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        resp = client.post(route, json=body, headers={"anthropic-version": "2023-06-01"})
        assert resp.status_code == 200, resp.get_data(as_text=True)


def test_llama_server_without_vision_gets_images_as_text(tmp_path):
    """llama-server's /props says modalities.vision false when it runs without --mmproj."""
    server = Server("llama.cpp", n_ctx=4096)
    get = server.get
    server.get = lambda path: (200, {**get(path)[1], "modalities": {"vision": False}}) if path == "/props" else get(path)
    body = {**ANTH, "messages": [{"role": "user", "content": [{"type": "image", "source": PNG},
                                                             {"type": "text", "text": "what is it?"}]}]}
    with proxy_for(tmp_path, server) as client:
        assert client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}).status_code == 200
    content = server.chats[-1]["messages"][0]["content"]
    assert [p["type"] for p in content] == ["text", "text"] and "left out" in content[0]["text"]


def test_a_recording_against_a_text_only_upstream_replays(tmp_path):
    fake = FakeUpstream(Reply.text("ok"))
    fake.input_modalities = ["text"]
    with fake.serve() as url:
        app = create_app(proxy_config(url, tmp_path, RECORD=str(tmp_path / "rec")))
        body = {**ANTH, "messages": [{"role": "user", "content": [{"type": "image", "source": PNG},
                                                                 {"type": "text", "text": "what?"}]}]}
        resp = app.test_client().post("/v1/messages", json=body)
        assert resp.status_code == 200
        resp.close()  # the cassette is written once the response is closed
        app.extensions["kimi"].recorder.flush()
    (path,) = (tmp_path / "rec").iterdir()
    cassette = load(path)
    assert cassette["served"] == {"id": "fake", "text_only": True}
    assert unexplained(replay(cassette), []) == []
