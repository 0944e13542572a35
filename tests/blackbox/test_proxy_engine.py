"""Black-box: the real `kimi-engine` (default model, temporary socket) behind the real
`kimi-proxy` (subprocess, temporary port), driven by the official SDKs."""
import shutil

import anthropic
import openai
import pytest

from tests.support.engine import Daemon
from tests.support.stack import proxy_in_front

# Not "Which city is the capital of France?": with the prompt run through W4A8 (int8 activations
# per 32, as llama.cpp quantizes them), greedy, the 135M model answers it "Le Grand Château,
# also known as the City of Light, ..." as native llama-server does on the same GGUF; this one
# it answers "The capital of France is Paris." under every SIMD cap (and under W4A16).
QUESTION = [{"role": "user", "content": "Name the capital of France."}]


@pytest.fixture(scope="module")
def stack(engine_cache, tmp_path_factory):
    engine = Daemon(engine_cache, "--max-context", "1024", "--threads", "2").start()
    with proxy_in_front(engine, tmp_path_factory.mktemp("proxy-state")) as port:
        yield f"http://127.0.0.1:{port}"
    engine.stop()
    shutil.rmtree(engine.dir, ignore_errors=True)


def test_claude_code_style_request_gets_real_text(stack):
    client = anthropic.Anthropic(base_url=stack, api_key="x", max_retries=0, timeout=120)
    events = list(client.messages.create(model="claude-sonnet-4-5", max_tokens=24, extra_body={"temperature": 0},
                                         messages=QUESTION, stream=True))
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert "Paris" in text and events[-1].type == "message_stop"
    usage = [e for e in events if e.type == "message_delta"][0].usage
    assert usage.input_tokens > 5 and usage.output_tokens > 0
    count = client.messages.count_tokens(model="claude-sonnet-4-5", messages=QUESTION)
    assert 5 < count.input_tokens < 200  # the engine's real tokenizer, not chars/4


def test_chat_and_responses_get_real_text(stack):
    client = openai.OpenAI(base_url=stack + "/v1", api_key="x", max_retries=0, timeout=120)
    out = client.chat.completions.create(model="any", max_tokens=24, temperature=0, messages=QUESTION)
    assert "Paris" in out.choices[0].message.content
    resp = client.responses.create(model="any", max_output_tokens=24, temperature=0, input=QUESTION[0]["content"])
    assert "Paris" in resp.output_text and resp.status in ("completed", "incomplete")


def test_agent_sized_max_tokens_fit_the_engine_context(stack):
    """Claude Code asks for 32,000 completion tokens; the engine here has 1,024 in all.
    The proxy lowers max_tokens to what is left after the prompt instead of passing on a 400."""
    client = anthropic.Anthropic(base_url=stack, api_key="x", max_retries=0, timeout=120)
    reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=32000, stop_sequences=["."],
                                   extra_body={"temperature": 0}, messages=QUESTION)
    assert "Paris" in reply.content[0].text
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", ".")  # engine's stop_reason
    chat = openai.OpenAI(base_url=stack + "/v1", api_key="x", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError, match="context"):
        chat.chat.completions.create(model="m", max_tokens=10, temperature=0,
                                     messages=[{"role": "user", "content": "hi " * 2000}])
