"""The five real coding-agent CLIs, unchanged, through kimi-proxy in front of a fake upstream.

Each client runs in a loopback-only network namespace (../shared/tools/agent-clients);
SERVER_CMD starts tests/e2e/fake_upstream.py and kimi-proxy inside it. Run with
`make test-clients` (the first run installs the clients, about 7 minutes).
"""
import json

import pytest

from tests.e2e.fake_upstream import ANSWER, MARKER, final_answer
from tests.e2e.harness import fake_upstream_cmd, printed_text, run_client

pytestmark = pytest.mark.realclient

TEXT_PROMPT = "Say hello."
TOOL_PROMPT = f"Run the shell command: echo {MARKER}, then tell me its output."
FINAL_ANSWER = final_answer(MARKER)
RESTORES_REASONING = ("claude", "codex", "opencode")

CASES = [
    ("claude", "text", {}), ("claude", "tool", {}),
    ("claude", "tool", {"MODEL": "kimi-linear-local"}),
    ("codex", "text", {}), ("codex", "tool", {}),
    ("codex", "tool", {"MODEL": "gpt-5.5"}),
    ("opencode-chat", "text", {}), ("opencode-chat", "tool", {}),
    ("opencode-responses", "text", {}), ("opencode-responses", "tool", {}),
    ("opencode-anthropic", "text", {}), ("opencode-anthropic", "tool", {}),
    ("cline", "text", {}), ("cline", "tool", {}),
    ("cline-openai-native", "text", {}), ("cline-openai-native", "tool", {}),
    ("cline-anthropic", "text", {}), ("cline-anthropic", "tool", {}),
    ("aider", "text", {}), ("aider-anthropic", "text", {}),
]


def case_id(case) -> str:
    client, scenario, env = case
    return "-".join([client, scenario] + [v for v in env.values()])


def test_final_answer_is_in_neither_the_prompt_nor_the_tool_output():
    assert MARKER[::-1] in FINAL_ANSWER and MARKER not in FINAL_ANSWER
    assert FINAL_ANSWER not in TOOL_PROMPT
    assert final_answer("no marker here") != FINAL_ANSWER


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_client(case, tmp_path):
    client, scenario, extra_env = case
    prompt = TOOL_PROMPT if scenario == "tool" else TEXT_PROMPT
    run = run_client(client, prompt, fake_upstream_cmd(tmp_path, scenario), tmp_path,
                     scenario=scenario, **extra_env)
    assert run.returncode == 0, run.context()
    requests = [json.loads(line) for line in (tmp_path / "upstream.jsonl").read_text().splitlines()]
    if scenario == "text":
        assert ANSWER in printed_text(run.stdout), run.context()
        return
    turn2 = [r for r in requests if r["tool_result"] is not None]
    assert turn2 and MARKER in turn2[-1]["tool_result"], requests
    # the answer the upstream gave after the tool ran, printed by the client
    assert FINAL_ANSWER in printed_text(run.stdout), run.context()
    if client.startswith(RESTORES_REASONING):
        assert turn2[-1]["reasoning_restored"], requests
