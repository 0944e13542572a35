"""A scripted OpenAI Chat Completions server to stand behind kimi-proxy in end-to-end tests.

    python tests/e2e/fake_upstream.py --port 9100 --scenario tool --log /tmp/upstream.jsonl

Scenarios:
  text         one streamed (or JSON) answer.
  tool         turn 1 streams reasoning_content, then a native call of the shell-like tool the
               request declared, with arguments built from that tool's JSON schema; once a tool
               result comes back, it answers with `final_answer(result)`, a sentence that
               appears neither in the command nor in its output.
  reasoning    reasoning_content deltas before text; turn 2 checks the reasoning came back.
  interleaved  two parallel tool calls whose argument fragments interleave.
Turns are keyed on whether a tool result (or an earlier assistant turn) is present, since
opencode first sends a tool-less title request. A request whose history was compacted into a
summary that holds the final answer (Codex) gets COMPACTED_ANSWER. With --usage-from-size,
usage counts the request's bytes / 4 as prompt tokens, so that a client's auto-compaction limit
is reached. Each request appends one JSON line to --log: {"turn", "scenario", "stream",
"tools", "tool_result", "reasoning_restored", "last_user"}.
"""
import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REASONING = "The user wants a shell command run; I will call the shell tool with echo."
ANSWER = "Hello from the fake upstream."
SHELL_HINTS = ("bash", "shell", "exec", "command", "terminal", "run")
COMPACTED_ANSWER = "Resumed from the compacted summary."
MARKER = "tool-ran-ok"
COMMAND = f"echo {MARKER}"


def final_answer(tool_result: str) -> str:
    """The answer after the tool ran. It quotes the marker reversed, so a client that printed it
    printed this answer, not the command or the tool's output."""
    if MARKER in tool_result:
        return f"After the tool ran: its output, reversed, reads {MARKER[::-1]}."
    return "After the tool ran: its output lacked the marker."


def shell_tool(tools: list[dict]) -> dict | None:
    functions = [t.get("function", t) for t in tools or [] if t.get("type", "function") == "function"]
    for hint in SHELL_HINTS:
        for fn in functions:
            if hint in fn.get("name", "").lower():
                return fn
    return None


def value_for(name: str, schema: dict):
    """A value of the schema's type; command-like fields carry the echo command."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "array":
        items = schema.get("items", {})
        if "command" in name.lower():
            return ["bash", "-lc", COMMAND] if name == "command" else [COMMAND]
        return [value_for(name, items)] if items.get("type") == "string" else []
    if kind == "object":
        return arguments_for(schema)
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return 10000 if "timeout" in name.lower() else 1
    return COMMAND if "command" in name.lower() or name in ("cmd", "script") else "Echo a test string"


def arguments_for(schema: dict) -> dict:
    props = schema.get("properties", {})
    wanted = set(schema.get("required", [])) | {p for p in props if "command" in p.lower()}
    return {name: value_for(name, props[name]) for name in props if name in wanted}


def last_tool_result(messages: list[dict]) -> str | None:
    for msg in reversed(messages):
        if msg.get("role") == "tool":
            content = msg.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return None


def text_of(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def last_user(messages: list[dict]) -> str:
    return next((text_of(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")


def reasoning_restored(messages: list[dict]) -> bool:
    for msg in messages:
        if msg.get("role") == "assistant":
            text = msg.get("reasoning_content") or msg.get("reasoning") or ""
            if REASONING in text or f"<think>{REASONING}</think>" in (msg.get("content") or ""):
                return True
    return False


class Script:
    """What to answer: a list of chat-completion deltas plus a finish reason."""

    def __init__(self, scenario: str, body: dict):
        self.body = body
        messages = body.get("messages", [])
        self.tool_result = last_tool_result(messages)
        self.turn = 2 if self.tool_result is not None or any(
            m.get("role") == "assistant" for m in messages) else 1
        self.scenario = scenario

    def deltas(self) -> tuple[list[dict], str]:
        if self.scenario == "tool" and final_answer(MARKER) in last_user(self.body.get("messages", [])):
            return self.text(COMPACTED_ANSWER), "stop"
        if self.scenario == "tool" and self.turn == 1:
            fn = shell_tool(self.body.get("tools", []))
            if fn is not None:
                args = json.dumps(arguments_for(fn.get("parameters", {})))
                return self.reasoning() + self.calls([(fn["name"], args)]), "tool_calls"
        if self.scenario == "interleaved" and self.turn == 1:
            return self.interleaved(), "tool_calls"
        if self.scenario in ("tool", "interleaved") and self.tool_result is not None:
            return self.text(final_answer(self.tool_result)), "stop"
        if self.scenario == "reasoning":
            return self.reasoning() + self.text(ANSWER), "stop"
        return self.text(ANSWER), "stop"

    @staticmethod
    def reasoning() -> list[dict]:
        words = REASONING.split(" ")
        return [{"reasoning_content": w + (" " if i < len(words) - 1 else "")}
                for i, w in enumerate(words)]

    @staticmethod
    def text(text: str) -> list[dict]:
        words = text.split(" ")
        return [{"content": w + (" " if i < len(words) - 1 else "")} for i, w in enumerate(words)]

    @staticmethod
    def calls(calls: list[tuple[str, str]]) -> list[dict]:
        out = []
        for i, (name, args) in enumerate(calls):
            out.append({"tool_calls": [{"index": i, "id": f"call_fake{i}", "type": "function",
                                        "function": {"name": name, "arguments": ""}}]})
            for cut in range(0, len(args), 7):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": args[cut:cut + 7]}}]})
        return out

    def interleaved(self) -> list[dict]:
        fn = shell_tool(self.body.get("tools", [])) or {"name": "shell", "parameters": {}}
        args = [json.dumps({"command": "echo one"}), json.dumps({"command": "echo two"})]
        out = [{"tool_calls": [{"index": i, "id": f"call_fake{i}", "type": "function",
                                "function": {"name": fn["name"], "arguments": ""}}]} for i in (0, 1)]
        for cut in range(0, max(map(len, args)), 5):
            for i in (0, 1):
                if args[i][cut:cut + 5]:
                    out.append({"tool_calls": [{"index": i, "function": {"arguments": args[i][cut:cut + 5]}}]})
        return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    scenario = "text"
    log_path = None
    usage_from_size = False
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def send_body(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        head = (f"HTTP/1.1 {status} OK\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\n\r\n").encode()
        self.wfile.write(head + data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            return self.send_body(200, {"object": "list", "data": [
                {"id": "fake-model", "object": "model", "owned_by": "fake"}]})
        self.send_body(200 if self.path in ("/health", "/") else 404, {"ok": True})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if not self.path.endswith("/chat/completions"):
            return self.send_body(404, {"error": {"message": f"no route {self.path}",
                                                  "type": "invalid_request_error"}})
        script = Script(self.scenario, body)
        deltas, finish = script.deltas()
        self.record(script, body)
        if body.get("stream"):
            self.stream(deltas, finish, body)
        else:
            self.send_body(200, self.whole(body, deltas, finish))

    def record(self, script: Script, body: dict):
        if not self.log_path:
            return
        line = {"turn": script.turn, "scenario": self.scenario, "stream": bool(body.get("stream")),
                "tools": [t.get("function", t).get("name") for t in body.get("tools") or []],
                "tool_result": script.tool_result,
                "reasoning_restored": reasoning_restored(body.get("messages", [])),
                "last_user": last_user(body.get("messages", []))[:4000]}
        with self.lock, open(self.log_path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def usage(self, body: dict, deltas: list[dict]) -> dict:
        prompt = len(json.dumps(body)) // 4 if self.usage_from_size else 10
        return {"prompt_tokens": prompt, "completion_tokens": len(deltas),
                "total_tokens": prompt + len(deltas)}

    def whole(self, body: dict, deltas: list[dict], finish: str) -> dict:
        content = "".join(d.get("content", "") for d in deltas) or None
        reasoning = "".join(d.get("reasoning_content", "") for d in deltas) or None
        calls: dict[int, dict] = {}
        for d in deltas:
            for tc in d.get("tool_calls", []):
                call = calls.setdefault(tc["index"], {"id": tc.get("id"), "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += tc["function"].get("name", "")
                call["function"]["arguments"] += tc["function"].get("arguments", "")
        message = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                "model": "fake-model", "choices": [{"index": 0, "message": message,
                                                     "finish_reason": finish}],
                "usage": self.usage(body, deltas)}

    def stream(self, deltas: list[dict], finish: str, body: dict):
        self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"cache-control: no-cache\r\nconnection: close\r\n\r\n")
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": "fake-model"}
        events = [{"role": "assistant", "content": ""}] + deltas
        for delta in events:
            chunk = dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": None}])
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(f"data: {json.dumps(dict(base, choices=[{'index': 0, 'delta': {}, 'finish_reason': finish}]))}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = self.usage(body, deltas)
            self.wfile.write(f"data: {json.dumps(dict(base, choices=[], usage=usage))}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--scenario", choices=["text", "tool", "reasoning", "interleaved"], default="text")
    parser.add_argument("--log", help="append one JSON line per request here")
    parser.add_argument("--usage-from-size", action="store_true",
                        help="report the request's bytes / 4 as its prompt tokens")
    args = parser.parse_args()
    Handler.scenario, Handler.log_path = args.scenario, args.log
    Handler.usage_from_size = args.usage_from_size
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
