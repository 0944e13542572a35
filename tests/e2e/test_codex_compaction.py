"""Codex compacting its history through kimi-proxy (tests/fixtures/live-clients/README.md says
what it sends). The fake upstream reports each request's size as its usage, so a small
`model_auto_compact_token_limit` is reached in the middle of the tool turn.
"""
import json

import pytest

from tests.e2e.fake_upstream import COMPACTED_ANSWER, MARKER, final_answer
from tests.e2e.harness import fake_upstream_cmd, printed_text, run_client

pytestmark = pytest.mark.realclient

PROMPT = f"Run the shell command: echo {MARKER}, then tell me its output."
QUIET = "--disable plugins --disable remote_plugin --disable apps -c analytics.enabled=false"
SMALL_WINDOW = "-c model_context_window=20000 -c model_auto_compact_token_limit=6000"
COMPACTION_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION."


def run_compacting_codex(tmp_path, *extra: str):
    run = run_client("codex", PROMPT, fake_upstream_cmd(tmp_path, "tool", "--usage-from-size"),
                     tmp_path, scenario="tool", CODEX_EXTRA=" ".join((QUIET, SMALL_WINDOW) + extra))
    log = tmp_path / "upstream.jsonl"
    requests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return run, requests


@pytest.mark.parametrize("provider", [
    # any other name: Codex itself asks for a summary, with a plain request
    "Stub",
    # remote compaction v2: a compaction_trigger item; the proxy summarises with the same prompt
    # and hands back a compaction item, which Codex echoes and the proxy expands again
    "OpenAI",
])
def test_compaction_summarises_through_the_proxy(provider, tmp_path):
    run, requests = run_compacting_codex(tmp_path, f"-c model_providers.stub.name='\"{provider}\"'")
    assert run.returncode == 0, run.context()
    asks = [i for i, r in enumerate(requests) if r["last_user"].startswith(COMPACTION_PROMPT)]
    assert asks, requests
    assert requests[asks[0]]["tools"] == [] and MARKER in requests[asks[0]]["tool_result"], requests
    # the summary (the upstream's answer to the compaction prompt) opens the next window
    assert any(final_answer(MARKER) in r["last_user"] for r in requests[asks[0] + 1:]), requests
    assert COMPACTED_ANSWER in printed_text(run.stdout), run.context()
