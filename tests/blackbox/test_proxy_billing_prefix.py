"""Black-box: Claude Code's two-turn tool loop (claude-tool.jsonl.gz, cut to the default
model's 8k context) through kimi-proxy in front of the real kimi-engine. Its billing block
carries a `cch=` that changes between turns, as some Claude Code versions send it; the
proxy drops the block, so turn 2 reuses all of turn 1's prompt from the prefix cache."""
import copy
import gzip
import json
import pathlib
import shutil

import pytest

from engined.engine.prefix_cache import BLOCK
from proxy.app import create_app
from tests.support.engine import Daemon, metric
from tests.support.proxy_fakes import proxy_config

pytestmark = pytest.mark.slow  # ~150 s of engine prefill on 2 cores: make test-slow (CI runs it)

CAPTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "live-clients" / "claude-tool.jsonl.gz"
HIT = "kimi_engine_prefix_cache_hit_tokens_total"
SYSTEM_CHARS, REMINDER_CHARS, TOOLS, DESCRIPTION_CHARS = 3000, 800, ("Bash", "Read"), 300


def claude_turns() -> tuple[dict, list[dict]]:
    """(headers, [turn 1, turn 2]) with the same cuts on both turns and a per-turn cch=."""
    records = [json.loads(line) for line in gzip.open(CAPTURE, "rt")]
    records = [r for r in records if r["method"] == "POST"]
    headers = {k: v for k, v in dict(records[0]["headers"]).items()
               if k.lower() not in ("host", "content-length", "accept-encoding")}
    turns = []
    for n, record in enumerate(records):
        body = copy.deepcopy(record["body"])
        billing, _cc, system = body["system"]
        assert billing["text"].startswith("x-anthropic-billing-header:")
        billing["text"] += f" cch={'%05x' % (0x3f9a1 + n)};"
        system["text"] = system["text"][:SYSTEM_CHARS]
        reminder = body["messages"][0]["content"][0]
        reminder["text"] = reminder["text"][:REMINDER_CHARS]
        body["tools"] = [{**t, "description": t["description"][:DESCRIPTION_CHARS]}
                         for t in body["tools"] if t["name"] in TOOLS]
        body.update(stream=False, max_tokens=4, temperature=0)
        turns.append(body)
    assert [len(t["messages"]) for t in turns] == [1, 3]
    assert turns[0]["system"][0] != turns[1]["system"][0]  # the cch= differs
    return headers, turns


def test_turn_two_reuses_turn_one_despite_a_new_cch(engine_cache, tmp_path):
    headers, (turn1, turn2) = claude_turns()
    engine = Daemon(engine_cache, "--max-context", "8192", "--threads", "2").start()
    try:
        app = create_app(proxy_config("unix://" + engine.sock, tmp_path))
        client = app.test_client()
        first = client.post("/v1/messages?beta=true", json=turn1, headers=headers)
        assert first.status_code == 200, first.get_data(as_text=True)
        turn1_tokens = first.get_json()["usage"]["input_tokens"]
        assert metric(engine.sock, HIT) == 0
        second = client.post("/v1/messages?beta=true", json=turn2, headers=headers)
        assert second.status_code == 200, second.get_data(as_text=True)
        hit = metric(engine.sock, HIT)
        app.extensions["kimi"].close()
    finally:
        engine.stop()
        shutil.rmtree(engine.dir, ignore_errors=True)
    assert turn1_tokens > 1000 and second.get_json()["usage"]["input_tokens"] > turn1_tokens
    assert hit >= turn1_tokens - BLOCK
