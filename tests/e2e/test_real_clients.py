"""The five real coding-agent CLIs, unchanged, through kimi-proxy in front of a fake upstream.

Each client runs in a loopback-only network namespace (../shared/tools/agent-clients);
SERVER_CMD starts tests/e2e/fake_upstream.py and kimi-proxy inside it. Run with
`make test-clients` (the first run installs the clients, about 7 minutes).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.realclient

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = ROOT.parent / "shared" / "tools" / "agent-clients" / "run_client.sh"
CLIENTS_DIR = pathlib.Path(os.environ.get("CLIENTS_DIR", "/tmp/kimi-agent-clients"))
PYTHON = pathlib.Path(sys.executable)
PROXY = PYTHON.parent / "kimi-proxy"
TEXT_PROMPT = "Say hello."
TOOL_PROMPT = "Run the shell command: echo tool-ran-ok, then tell me its output."
TEXT_ANSWER = "Hello from the fake upstream."
TOOL_ANSWER = "tool-ran-ok"
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


@pytest.fixture(scope="module", autouse=True)
def clients_installed():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("the real-client suite needs root and unshare (it makes network namespaces)")
    if not RUNNER.exists():
        pytest.fail(f"{RUNNER} is missing: ../shared sits beside the repository")
    subprocess.run(["bash", str(RUNNER.parent / "install.sh")], check=True, timeout=1800)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_client(case, tmp_path):
    client, scenario, extra_env = case
    upstream_log = tmp_path / "upstream.jsonl"
    server_cmd = (
        f"{PYTHON} {ROOT}/tests/e2e/fake_upstream.py --port 9100 --scenario {scenario} "
        f"--log {upstream_log} & exec {PROXY} serve --port 18080 "
        f"--upstream http://127.0.0.1:9100/v1 --ledger {tmp_path}/ledger.sqlite")
    env = dict(os.environ, SERVER_CMD=server_cmd, CLIENTS_DIR=str(CLIENTS_DIR),
               TIMEOUT="150", WAIT_S="60", CAPTURE=str(tmp_path / "capture.jsonl"), **extra_env)
    prompt = TOOL_PROMPT if scenario == "tool" else TEXT_PROMPT
    result = subprocess.run(["bash", str(RUNNER), client, "18080", prompt, scenario],
                            env=env, capture_output=True, text=True, timeout=400)
    server_log = CLIENTS_DIR / "logs" / f"server-{client}-{scenario}.log"
    context = (f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}\n"
               f"proxy log:\n{server_log.read_text()[-3000:] if server_log.exists() else ''}")
    assert result.returncode == 0, context
    requests = [json.loads(line) for line in upstream_log.read_text().splitlines()]
    if scenario == "text":
        assert TEXT_ANSWER in result.stdout, context
        return
    assert f"The tool said: {TOOL_ANSWER}" in result.stdout or TOOL_ANSWER in result.stdout, context
    turn2 = [r for r in requests if r["tool_result"] is not None]
    assert turn2 and TOOL_ANSWER in turn2[-1]["tool_result"], requests
    if client.startswith(RESTORES_REASONING):
        assert turn2[-1]["reasoning_restored"], requests
