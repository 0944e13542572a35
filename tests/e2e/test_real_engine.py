"""Real clients through kimi-proxy in front of kimi-engine serving the default model.

aider, Cline and opencode (Chat Completions) send prompts that fit SmolLM2-135M's 8k context
(measured: aider 670 tokens, Cline 5,686, opencode 586 + 7,723): each must print what the engine
answered. Codex (~9.1k tokens) and Claude Code (~29k) do not fit: the proxy counts their prompt and
refuses it before it is sent, in OpenAI's words with the `context_length_exceeded` code and a
hint at what to serve.

Slow on CPU: the engine loads in 5-30 s and prefills opencode's 7.7k-token prompt in minutes
on two busy cores, hence the long timeouts.
"""
import json

import pytest

from tests.e2e.harness import EngineRun, check_printed_answer, printed_text, run_client

# Not "Say hello.": greedy, the 135M model's answer to it in aider's prompt is "Hello." and then
# either more text or its end token, as the CPU's rounding falls (one CI machine stopped there,
# below MIN_WORDS). Asked for a sentence, it answered 11-28 words under every SIMD cap.
PROMPT = "Say hello in a full sentence."
CHAT = "POST /v1/chat/completions"
TOKENIZE = "POST /tokenize"
# opencode-chat's title request is capped at side-max-tokens by the proxy: uncapped, it could
# fill the 8k cache so that the 7.7k-token agent turn timed out in the queue.
TEXT_CLIENTS = ["aider", "cline", "opencode-chat"]
# Greedy, as aider and Cline are by their presets: opencode sends no temperature for a model it
# does not know, so the engine sampled at 1.0, and one CI run's answer was the one word
# "Successful." (below MIN_WORDS). A user sets this the same way, per agent (opencode 1.18's
# schema). Greedy, the answer was the same 6 words under every SIMD cap and with AMX.
CLIENT_ENV = {"opencode-chat": {"OPENCODE_CONFIG_CONTENT": json.dumps(
    {"agents": {"build": {"request": {"body": {"temperature": 0}}}}})}}
CLIENT_TIMEOUT_S, ENGINE_WAIT_S = 900, 300

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(CLIENT_TIMEOUT_S + ENGINE_WAIT_S + 180)]


def chat_lines(engine: EngineRun, route: str = CHAT) -> list[dict]:
    return [r for r in engine.engine_requests() if r["route"] == route]


def refused_before_sent(engine: EngineRun) -> bool:
    """The proxy counted the prompt (the engine refuses to count past its context) and answered
    the overflow itself: the turn never reached the chat route."""
    counted = [r["status"] for r in chat_lines(engine, TOKENIZE)]
    return chat_lines(engine) == [] and counted == ["400"]


@pytest.mark.parametrize("client", TEXT_CLIENTS)
def test_text_turn_prints_the_engines_answer(client, tmp_path):
    engine = EngineRun(tmp_path)
    run = run_client(client, PROMPT, engine.server_cmd(), tmp_path,
                     timeout_s=CLIENT_TIMEOUT_S, wait_s=ENGINE_WAIT_S, **CLIENT_ENV.get(client, {}))
    context = run.context() + "\n" + engine.logs()
    assert run.returncode == 0, context
    served = chat_lines(engine)
    assert served and all(r["status"] == "200" for r in served), context
    recorded = [c for c in engine.recorded() if c["request"]["path"].endswith("/chat/completions")]
    assert len(recorded) == len(served), context
    if client in CLIENT_ENV:
        turn = max(recorded, key=lambda c: len(str(c["upstream"]["request"])))
        assert turn["upstream"]["request"].get("temperature") == 0, f"not greedy\n{context}"
    check_printed_answer(run, engine, context)


def test_codex_is_told_its_prompt_does_not_fit(tmp_path):
    """Codex recognises the code: it prints its own sentence, not the proxy's message."""
    engine = EngineRun(tmp_path)
    run = run_client("codex", PROMPT, engine.server_cmd(), tmp_path, wait_s=ENGINE_WAIT_S)
    context = run.context() + "\n" + engine.logs()
    assert run.returncode != 0, context
    assert refused_before_sent(engine), context
    assert "ran out of room in the model's context window" in run.stdout, context


def test_claude_code_is_told_what_to_serve_instead(tmp_path):
    """A first turn that does not fit cannot be compacted, so the proxy does not use the API's
    "prompt is too long" wording (which Claude Code replaces with its own advice to compact):
    Claude Code prints our message, naming the model and context to serve."""
    engine = EngineRun(tmp_path)
    run = run_client("claude", PROMPT, engine.server_cmd(), tmp_path, wait_s=ENGINE_WAIT_S)
    context = run.context() + "\n" + engine.logs()
    assert run.returncode != 0, context
    assert refused_before_sent(engine), context
    printed = printed_text(run.stdout)
    assert "API Error: 400" in printed and "maximum context length is 8192" in printed, context
    assert "Kimi-Linear" in printed and "--max-context 65536" in printed, context
