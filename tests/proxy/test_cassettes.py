"""Every shipped cassette replays to the recorded client bytes and upstream payload,
except for the differences listed in tests/fixtures/cassettes/allowlist.json, each tied
to a requirement of issue #3. Any unlisted difference fails, and so does a stale entry."""
import copy
import json
import pathlib

import pytest

from proxy.cassettes import replay

DIR = pathlib.Path(__file__).parents[1] / "fixtures" / "cassettes"
ALLOW = json.loads((DIR / "allowlist.json").read_text())
CASSETTES = sorted(p for p in DIR.glob("*.json.gz"))
# k3's preset names -> ours (k3's generic "openai" is our "openai-sdk").
PRESET = {"openai": "openai-sdk"}


def name_of(path: pathlib.Path) -> str:
    return path.name.split(".")[0]


def test_fixtures_are_complete():
    assert (DIR / "NOTICE").read_text().startswith("These cassettes come from the public project")
    assert len(CASSETTES) == 11
    assert set(ALLOW) <= {name_of(p) for p in CASSETTES}
    for entries in ALLOW.values():
        for entry in entries:
            assert entry["side"] in ("status", "upstream", "client")
            assert "issue #3" in entry["requirement"] or "protocols.md" in entry["requirement"]


@pytest.mark.parametrize("path", CASSETTES, ids=name_of)
def test_cassette_replays(path):
    cassette = replay.load(path)
    result = replay.replay(cassette)
    entries = ALLOW.get(name_of(path), [])
    left = replay.unexplained(result, entries)
    assert not left, "\n".join(f"{part}: {replay.describe(d)}" for part, d in left)
    for entry in entries:  # a stale entry (explaining nothing) must be removed
        assert any(entry["side"] == part and replay._allowed(d, entry, result["docs"])
                   for part in ("upstream", "client", "status") for d in result[part]), entry["path"]
    assert result["preset"] == PRESET.get(cassette["preset"], cassette["preset"])


def test_a_changed_reply_is_caught():
    cassette = replay.load(DIR / "opencode-tools-stream.json.gz")
    mutated = copy.deepcopy(cassette)
    for chunk in mutated["upstream"]["chunks"]:
        for choice in chunk.get("choices", []):
            if "reasoning_content" in choice.get("delta", {}):
                choice["delta"]["reasoning_content"] = choice["delta"]["reasoning_content"].upper()
                break
    left = replay.unexplained(replay.replay(mutated), [])
    assert any("reasoning_content" in p for _part, (p, _a, _b) in left)


def test_a_changed_upstream_payload_is_caught():
    cassette = replay.load(DIR / "cline-reasoning-stream.json.gz")
    mutated = copy.deepcopy(cassette)
    mutated["request"]["body"]["messages"][0]["content"] += " (edited)"
    left = replay.unexplained(replay.replay(mutated), [])
    assert any(part == "upstream" and p.startswith("$.messages") for part, (p, _a, _b) in left)


def test_replay_command_reports_every_cassette():
    lines = []
    assert replay.replay_paths([str(DIR)], echo=lines.append, allowlist=str(DIR / "allowlist.json")) == 0
    assert lines[-1] == "11/11 cassettes match" and sum(line.startswith("pass ") for line in lines) == 11
    lines.clear()
    assert replay.replay_paths([str(DIR / "openai-sdk-stream.json.gz")], echo=lines.append) == 1  # no allowlist
    assert lines[0].startswith("FAIL") and "reasoning_content" in lines[1]
