"""Every request the five real clients sent (../shared/fixtures/live-clients) is served:
accepted, translated into a sane upstream payload, and answered in its dialect."""
import gzip
import json

import pytest

from proxy import sse
from proxy.app import create_app
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

SKIP_HEADERS = {"host", "content-length", "accept-encoding", "transfer-encoding", "connection"}


def captures(shared_dir):
    for path in sorted((shared_dir / "fixtures" / "live-clients").glob("*.jsonl.gz")):
        records = [json.loads(line) for line in gzip.open(path).read().decode().splitlines()]
        yield path.name.split(".")[0], records


def headers_of(record) -> dict:
    items = record["headers"].items() if isinstance(record["headers"], dict) else record["headers"]
    return {k: v for k, v in items if k.lower() not in SKIP_HEADERS}


def test_every_live_client_request_is_served(shared_dir, tmp_path):
    fake = FakeUpstream(Reply.text("ok", reasoning="thinking"))
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = fake.client()
    client = app.test_client()
    num_posts = 0
    for name, records in captures(shared_dir):
        for record in records:
            if record["method"] != "POST":
                assert client.open(record["path"], method=record["method"]).status_code == 200
                continue
            body = record["body"] if isinstance(record["body"], dict) else json.loads(record["body"])
            resp = client.post(record["path"], json=body, headers=headers_of(record))
            assert resp.status_code == 200, (name, resp.get_data(as_text=True)[:300])
            num_posts += 1
            sent = fake.requests[-1]
            # Claude Code's mid-conversation system message may come last; it stays in place.
            assert [m for m in sent["messages"] if m["role"] != "system"][-1]["role"] in ("user", "tool"), name
            raw = resp.get_data()
            if body.get("stream"):
                frames = sse.parse_frames(raw)
                last = frames[-1]
                assert last in ((None, "[DONE]"), ("message_stop", '{"type":"message_stop"}')) \
                    or last[0] == "response.completed", (name, last)
            if name.endswith("-tool") and record is records[-1]:
                assert any(m["role"] == "tool" for m in sent["messages"]), name
            if name == "claude-tool" and record is records[-1]:
                echoed = [m for m in sent["messages"] if m["role"] == "assistant"][-1]
                assert echoed.get("reasoning_content") and echoed["tool_calls"][0]["function"]["name"] == "Bash"
    assert num_posts >= 40
