"""A recorded agent conversation (Cline, tests/fixtures/live-clients) over HTTP: turn 2 hits the
prefix cache for the whole of turn 1's prompt, and its reply equals a cache-less engine's."""
import copy
import gzip
import json
import pathlib


from tests.support.engine import InProcessEngine, metric, post  # noqa: E402

from engined.engine.prefix_cache import BLOCK  # noqa: E402

CAPTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "live-clients" / "cline-tool.jsonl.gz"
HIT = "kimi_engine_prefix_cache_hit_tokens_total"
# Trimmed so the test prefills ~2k tokens, not 5.7k: the same cut on both turns.
SYSTEM_CHARS, NUM_TOOLS = 3000, 4


def agent_turns() -> list[dict]:
    """Turn 1 (system + user) and turn 2 (+ assistant tool call + tool result), greedy, short."""
    bodies = [json.loads(line)["body"] for line in gzip.open(CAPTURE)]
    turns = []
    for body in bodies:
        body = copy.deepcopy(body)
        body["messages"][0]["content"] = body["messages"][0]["content"][:SYSTEM_CHARS]
        body["tools"] = body["tools"][:NUM_TOOLS]
        body.update(stream=False, max_tokens=4, temperature=0)
        turns.append(body)
    assert [len(t["messages"]) for t in turns] == [2, 4]
    return turns


def chat(sock: str, body: dict) -> dict:
    resp = post(sock, "/v1/chat/completions", body, timeout=300)
    assert resp.status == 200, resp.body
    return resp.json()


def test_turn_two_hits_the_cache_for_all_of_turn_one(llama):
    turn1, turn2 = agent_turns()
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=8192) as warm:
        first = chat(warm.sock, turn1)
        turn1_tokens = first["usage"]["prompt_tokens"]
        assert metric(warm.sock, HIT) == 0
        second = chat(warm.sock, turn2)
        hit = metric(warm.sock, HIT)
    assert turn1_tokens > 1500 and second["usage"]["prompt_tokens"] > turn1_tokens
    assert hit >= turn1_tokens - BLOCK
    cold_engine = InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=8192)
    cold_engine.engine.prefix_cache.budget_bytes = 0  # the same engine, its cache off
    with cold_engine as cold:
        reference = chat(cold.sock, turn2)
        assert metric(cold.sock, HIT) == 0
    assert second["choices"][0]["message"] == reference["choices"][0]["message"]
