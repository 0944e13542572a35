"""opencode's title request (a side request) is capped at side-max-tokens; its agent turn and
every other captured request keep the max_tokens they asked for."""
import gzip
import json
import pathlib

import pytest

from proxy import canonical as c
from proxy import config
from proxy.app import create_app
from proxy.clients.side_tasks import side_task
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

CAPTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "live-clients"
SKIP_HEADERS = {"host", "content-length", "accept-encoding", "transfer-encoding", "connection"}


def posts(name):
    for line in gzip.open(CAPTURES / f"{name}.jsonl.gz").read().decode().splitlines():
        record = json.loads(line)
        if record["method"] == "POST":
            body = record["body"] if isinstance(record["body"], dict) else json.loads(record["body"])
            items = record["headers"].items() if isinstance(record["headers"], dict) else record["headers"]
            yield record["path"], body, {k: v for k, v in items if k.lower() not in SKIP_HEADERS}


def sent_limits(tmp_path, name, **cfg):
    fake = FakeUpstream(Reply.text("A title"))
    app = create_app({**proxy_config("http://127.0.0.1:9/v1", tmp_path), **cfg})
    app.extensions["kimi"].upstream = fake.client()
    client = app.test_client()
    limits = []
    for path, body, headers in posts(name):
        resp = client.post(path, json=body, headers=headers)
        assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
        sent = fake.requests[-1]
        limits.append((bool(sent.get("tools")), sent.get("max_tokens") or sent.get("max_completion_tokens")))
    return limits


@pytest.mark.parametrize("name", ["opencode-chat-text", "opencode-responses-text", "opencode-anthropic-text"])
def test_opencode_title_request_is_capped_and_its_agent_turn_is_not(tmp_path, name):
    title, turn = sent_limits(tmp_path, name)
    assert title == (False, 256)
    assert turn[0] is True and turn[1] > 256     # the agent turn keeps what it asked for


def test_the_cap_follows_side_max_tokens_and_zero_turns_it_off(tmp_path):
    assert sent_limits(tmp_path, "opencode-chat-text", SIDE_MAX_TOKENS=40)[0] == (False, 40)
    assert sent_limits(tmp_path, "opencode-chat-text", SIDE_MAX_TOKENS=0)[0] == (False, 32000)


@pytest.mark.parametrize("name", ["aider-text", "cline-text", "claude-text", "codex-text"])
def test_other_clients_requests_are_not_side_requests(tmp_path, name):
    before = [b.get("max_tokens") or b.get("max_output_tokens") for _p, b, _h in posts(name)]
    after = [limit for _tools, limit in sent_limits(tmp_path, name)]
    assert 256 not in after and len(after) == len(before)


def test_a_title_prompt_with_tools_is_not_a_side_request():
    system = c.Message("system", (c.Text("You are a title generator. You output ONLY a thread title."),))
    user = c.Message("user", (c.Text("hi"),))
    assert side_task(c.Request("m", (system, user))) == "title"
    tool = c.ToolSpec("bash", "run", {"type": "object"})
    assert side_task(c.Request("m", (system, user), tools=(tool,))) is None
    assert side_task(c.Request("m", (user,))) is None


def test_side_max_tokens_is_validated():
    assert config.load({"SIDE_MAX_TOKENS": "12"}, None, {})["SIDE_MAX_TOKENS"] == 12
    with pytest.raises(config.ConfigError, match="side-max-tokens must be >= 0"):
        config.load({"SIDE_MAX_TOKENS": -1}, None, {})


def test_the_context_hint_and_the_readme_suggest_the_same_max_context():
    import re
    from proxy.upstream.status import LARGER_CONTEXT_HINT
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    hinted = re.findall(r"--max-context (\d+)", LARGER_CONTEXT_HINT)
    assert hinted and set(re.findall(r"Claude Code and Codex, with `--max-context (\d+)`", readme)) == set(hinted)
