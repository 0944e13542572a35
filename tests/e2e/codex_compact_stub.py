"""The agent-clients recording stub, made to let Codex compact: how
tests/fixtures/live-clients/codex-compact.jsonl.gz was captured (see that folder's README).

    SERVER_CMD="python3 tests/e2e/codex_compact_stub.py --port 18080 --log CAPTURE --scenario tool"

Three changes to ../shared/tools/agent-clients/stub_server.py, which it imports:
- usage reports the request's size (bytes / 4) as input tokens, so Codex's auto-compact limit
  (`-c model_auto_compact_token_limit=...`) is reached; the stub's constant 12 never reaches it;
- a request that carries Codex's compaction prompt or a compacted summary counts as after the
  tool ran, so the tool scenario answers with text instead of calling the tool forever;
- a request whose input ends with Codex's `{"type": "compaction_trigger"}` item (remote
  compaction v2, sent when the provider is named "OpenAI") is answered with one `compaction`
  output item, streamed as output_item.added/done; POST .../responses/compact (never called by
  Codex 0.171) is logged and answered with the same item.
"""
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "shared" / "tools" / "agent-clients"))
import stub_server as stub  # noqa: E402

COMPACTION_MARKERS = ("CONTEXT CHECKPOINT COMPACTION", "produced a summary of its thinking",
                      '"type": "compaction"')
_resp_obj, _has_tool_output, _handle_any = stub.resp_obj, stub.resp_has_tool_output, stub.H.handle_any
_resp_items, _resp_sse = stub.resp_items, stub.resp_sse


def compaction_item() -> dict:
    return {"id": stub.rid("cmp_"), "type": "compaction", "encrypted_content": "stub-compaction-blob=="}


def is_compaction_trigger(body) -> bool:
    items = body.get("input") or []
    return bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == "compaction_trigger"


def resp_items(body):
    return [compaction_item()] if is_compaction_trigger(body) else _resp_items(body)


def resp_sse(body):
    events = _resp_sse(body)
    if is_compaction_trigger(body):  # the stub streams no event for an item type it does not know
        item = events[-1][1]["response"]["output"][0]
        events[-1:-1] = [("response.output_item.added", {"output_index": 0, "item": item}),
                         ("response.output_item.done", {"output_index": 0, "item": item})]
        for seq, (name, data) in enumerate(events):
            data.update(type=name, sequence_number=seq)
    return events


def resp_obj(body, status, output):
    obj = _resp_obj(body, status, output)
    if obj["usage"]:
        tokens = len(json.dumps(body)) // 4
        obj["usage"].update(input_tokens=tokens, total_tokens=tokens + obj["usage"]["output_tokens"])
    return obj


def resp_has_tool_output(body):
    text = json.dumps(body.get("input"))
    return _has_tool_output(body) or any(marker in text for marker in COMPACTION_MARKERS)


def handle_any(self):
    if not (self.command == "POST" and self.path.split("?")[0].endswith("/responses/compact")):
        return _handle_any(self)
    raw, _ = self.read_body()
    body = json.loads(raw or b"{}")
    reply = {"id": stub.rid("resp_"), "object": "response", "created_at": int(time.time()),
             "status": "completed", "model": body.get("model"),
             "output": [compaction_item()],
             "usage": {"input_tokens": len(raw) // 4, "output_tokens": 10,
                       "total_tokens": len(raw) // 4 + 10}}
    stub.log_record({"ts": time.time(), "method": "POST", "path": self.path,
                     "headers": [[k, v] for k, v in self.headers.items()], "body": body,
                     "body_bytes": len(raw), "reply": reply, "status": 200, "kind": "responses_compact"})
    self.send_json(200, reply)


stub.resp_obj, stub.resp_has_tool_output, stub.H.handle_any = resp_obj, resp_has_tool_output, handle_any
stub.resp_items, stub.resp_sse = resp_items, resp_sse
stub.H.do_GET = stub.H.do_POST = stub.H.do_HEAD = handle_any

if __name__ == "__main__":
    stub.main()
