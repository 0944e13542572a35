"""Structured outputs on the served path (issue 27): `python -m engined serve` on a temporary
Unix socket, the default model (SmolLM2-135M) on the CPU, greedy, the frozen set of
bench/structured_set.py.

- tools: share of `tool_choice: required` replies whose tool calls all name a listed tool and
  carry arguments that validate against that tool's schema (jsonschema, not the grammar);
  a reply without a tool call fails.
- schemas: share of `response_format: json_schema` replies whose content is JSON that
  validates against the schema.
- decode tok/s of streamed replies with a JSON-schema grammar and without any (same prompts),
  timed from the first to the last token chunk; the ratio is the grammar's cost.
- apply_patch: share of Codex apply_patch calls (20 edit prompts, tool_choice required) whose
  input llguidance's own Lark parser of the recorded grammar accepts, with the tool sent as the
  proxy sent it before (input: any string) and as it does now (the grammar as its pattern).
- compile ms: every tool schema of one recorded Claude Code request, cold, in this process.

    .venv/bin/python bench/structured.py [--max-tokens 256] [--limit N] [--no-write]
Writes bench/results/structured-DATE[-N].json.
"""
import argparse
import json
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # engined, proxy
from common import record, unix_post  # noqa: E402
from served import Engine, on_sigterm  # noqa: E402
import structured_set  # noqa: E402

import jsonschema  # noqa: E402

RATE_SCHEMA = {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}}},
               "required": ["steps"]}
RATE_PROMPTS = ("Plan a trip to Paris, step by step.", "How do I bake bread? List the steps.",
                "Explain how to set up a Python project, step by step.")


def post(sock: str, body: dict) -> dict:
    conn, resp = unix_post(sock, "/v1/chat/completions", body)
    data = json.loads(resp.read())
    conn.close()
    return {"status": resp.status, **data}


def valid_against(schema: dict, value) -> bool:
    try:
        jsonschema.validators.validator_for(schema)(schema).validate(value)
        return True
    except jsonschema.exceptions.ValidationError:
        return False
    except jsonschema.exceptions.SchemaError:
        return False


def cut_note(reply: dict) -> str:
    """Why a reply holds no call or no JSON, when the reason is max_tokens."""
    is_cut = reply.get("choices") and reply["choices"][0]["finish_reason"] == "length"
    return " (cut at max_tokens)" if is_cut else ""


def check_tool_reply(body: dict, reply: dict) -> str:
    """'ok' or why not."""
    if reply["status"] != 200:
        return f"status {reply['status']}"
    calls = reply["choices"][0]["message"].get("tool_calls") or []
    if not calls:
        return "no tool call" + cut_note(reply)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    for call in calls:
        name = call["function"]["name"]
        if name not in schemas:
            return f"unknown tool {name!r}"
        try:
            arguments = json.loads(call["function"]["arguments"])
        except ValueError:
            return "arguments not JSON"
        if not valid_against(schemas[name], arguments):
            return "arguments invalid"
    return "ok"


def check_schema_reply(schema: dict, reply: dict) -> str:
    if reply["status"] != 200:
        return f"status {reply['status']}"
    try:
        value = json.loads(reply["choices"][0]["message"].get("content") or "")
    except ValueError:
        return "not JSON" + cut_note(reply)
    return "ok" if valid_against(schema, value) else "invalid"


def share(results: list[str]) -> dict:
    reasons = {}
    for r in results:
        reasons[r] = reasons.get(r, 0) + 1
    return {"n": len(results), "valid": reasons.get("ok", 0),
            "share": reasons.get("ok", 0) / max(1, len(results)), "outcomes": reasons}


def run_tools(sock: str, max_tokens: int, limit: int | None) -> dict:
    results = []
    for body in structured_set.tool_prompts()[:limit]:
        reply = post(sock, {**body, "tool_choice": "required", "max_tokens": max_tokens, "temperature": 0})
        results.append(check_tool_reply(body, reply))
    return share(results)


def run_schemas(sock: str, max_tokens: int, limit: int | None) -> dict:
    results = []
    for _, body in structured_set.schema_prompts()[:limit]:
        reply = post(sock, {**body, "max_tokens": max_tokens, "temperature": 0})
        results.append(check_schema_reply(body["response_format"]["json_schema"]["schema"], reply))
    return share(results)


def run_apply_patch(sock: str, max_tokens: int, limit: int | None) -> dict | None:
    from engined.chat import load_text
    from engined.grammar.compile import ll_tokenizer
    from engined.weights.default_model import default_gguf_path
    from proxy.dialects.freeform import input_schema
    import llguidance as llg
    tool = structured_set.apply_patch()
    if tool is None:
        return None
    tokenizer, chat = load_text(default_gguf_path())
    ll, definition = ll_tokenizer(tokenizer, chat.stop_token_ids), tool["format"]["definition"]

    def accepts(text: str) -> bool:
        matcher = llg.LLMatcher(ll, llg.LLMatcher.grammar_from_lark(definition), log_level=0)
        return matcher.consume_tokens(ll.tokenize_str(text)) and matcher.is_accepting()

    out = {}
    for label, schema in (("plain", {"type": "string"}), ("grammar", input_schema(tool["format"]))):
        parameters = {"type": "object", "properties": {"input": schema}, "required": ["input"],
                      "additionalProperties": False}
        tools = [{"type": "function", "function": {"name": "apply_patch", "description": tool["description"],
                                                   "parameters": parameters}}]
        results = []
        for edit in structured_set.EDITS[:limit]:
            reply = post(sock, {"messages": [{"role": "user", "content": edit}], "tools": tools,
                                "tool_choice": "required", "parallel_tool_calls": False,
                                "max_tokens": max_tokens, "temperature": 0})
            calls = reply["choices"][0]["message"].get("tool_calls") or [] if reply["status"] == 200 else []
            try:
                patch = json.loads(calls[0]["function"]["arguments"])["input"] if calls else None
            except (ValueError, KeyError, TypeError):
                patch = None
            results.append(f"no call{cut_note(reply)}" if patch is None else "ok" if accepts(patch) else "rejected")
        out[label] = share(results)
    return out


def stream_rate(sock: str, body: dict) -> tuple[int, float]:
    """(tokens after the first, seconds from the first token chunk to the last)."""
    conn, resp = unix_post(sock, "/v1/chat/completions", {**body, "stream": True, "temperature": 0,
                                                          "stream_options": {"include_usage": True}})
    first = last = None
    tokens = 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        elif event.get("choices") and event["choices"][0]["delta"]:
            first, last = first or time.perf_counter(), time.perf_counter()
    conn.close()
    return max(0, tokens - 1), (last - first) if first else 0.0


def run_rates(sock: str, max_tokens: int, rounds: int = 2) -> dict:
    """Plain and constrained requests interleaved, so a busy host slows both alike."""
    constrained = {"type": "json_schema", "json_schema": {"name": "plan", "schema": RATE_SCHEMA}}
    cases = (("plain", {}), ("json_schema", {"response_format": constrained}))
    totals = {label: [0, 0.0] for label, _ in cases}
    for prompt in RATE_PROMPTS * rounds:
        for label, extra in cases:
            n, s = stream_rate(sock, {"messages": [{"role": "user", "content": prompt}],
                                      "max_tokens": max_tokens, **extra})
            totals[label][0] += n
            totals[label][1] += s
    out = {label: {"tokens": n, "seconds": s, "tok_s": n / s if s else 0.0}
           for label, (n, s) in totals.items()}
    out["ratio"] = out["json_schema"]["tok_s"] / out["plain"]["tok_s"] if out["plain"]["tok_s"] else None
    return out


def mask_metrics(metrics: dict) -> dict:
    """Mean mask compute ms per token and the share of masks ready before the logits."""
    ready = metrics.get('kimi_engine_grammar_masks_total{ready="yes"}', 0.0)
    late = metrics.get('kimi_engine_grammar_masks_total{ready="no"}', 0.0)
    count = metrics.get("kimi_engine_grammar_mask_seconds_count", 0.0)
    total = metrics.get("kimi_engine_grammar_mask_seconds_sum", 0.0)
    return {"masks": ready + late, "ready_share": ready / (ready + late) if ready + late else None,
            "mean_ms": 1e3 * total / count if count else None}


def compile_claude_request() -> dict | None:
    """Cold compiles (fresh compilers, least of 3): every tool schema of the first recorded
    Claude Code request with tools one by one, and its whole tool-call grammar; the same for
    the 172-tool Claude Code request in tests/fixtures/cassettes."""
    from engined.chat import load_text
    import engined.grammar.tools  # noqa: F401 - its imports (torch) stay outside the timing
    from engined.grammar.compile import Compiler
    from engined.weights.default_model import default_gguf_path
    tokenizer, chat = load_text(default_gguf_path())
    body = next(b for name, b in structured_set.recorded_bodies()
                if name.startswith("claude-tool") and b.get("tools"))
    out = {}
    for label, tools in (("live", body["tools"]), ("cassette", structured_set.cassette_tools())):
        chat_tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": s}}
                      for tool in tools for n, d, s in structured_set.function_tools(tool)]
        schemas_ms, grammar_ms = [], []
        for _ in range(3):  # each in a fresh compiler (cold); the least of 3: a busy host adds noise
            compiler = Compiler(tokenizer, chat.stop_token_ids, log=lambda line: None)
            started = time.perf_counter()
            for tool in chat_tools:
                compiler.json_schema(tool["function"]["parameters"])
            schemas_ms.append((time.perf_counter() - started) * 1e3)
            compiler = Compiler(tokenizer, chat.stop_token_ids, log=lambda line: None)
            started = time.perf_counter()
            compiler.lark(chat.tool_grammar(chat_tools, "*", True)[0])
            grammar_ms.append((time.perf_counter() - started) * 1e3)
        out[label] = {"tools": len(chat_tools), "schemas_ms": min(schemas_ms), "tool_grammar_ms": min(grammar_ms)}
    return out


def rates_only(engine, args):
    try:
        rates = run_rates(engine.sock, 96, args.rates_only)
        masks = mask_metrics(engine.metrics())
    finally:
        engine.stop()
    print("rates", json.dumps(rates), "\nmasks", json.dumps(masks))
    if not args.no_write:
        record("structured_rates", {"python": platform.python_version(), "decode": rates, "masks": masks},
               "Decode under a JSON-schema grammar, CPU (issue 27)", command_line(),
               ["| what | measured | goal |", "|---|---|---|", *rate_lines(rates, masks)])


def command_line() -> str:
    return " ".join(["bench/structured.py", *sys.argv[1:]])


def share_cell(result: dict | None) -> str:
    return "not run" if result is None else f"{result['valid']}/{result['n']} ({result['share']:.0%})"


def rate_lines(rates: dict, masks: dict) -> list[str]:
    ready = masks["ready_share"]
    return [f"| decode tok/s without a grammar | {rates['plain']['tok_s']:.1f} |  |",
            f"| decode tok/s under a JSON schema | {rates['json_schema']['tok_s']:.1f} |  |",
            f"| with ÷ without (interleaved) | {rates['ratio']:.2f} | ≥ 0.90 |",
            f"| masks ready before the logits | {'—' if ready is None else f'{ready:.1%}'} |  |",
            f"| mean mask ms per token | {masks['mean_ms'] or 0:.3f} |  |"]


def report_lines(tools, schemas, patches, rates, masks, compiled, max_tokens) -> list[str]:
    patches = patches or {}
    lines = ["| what | measured | goal |", "|---|---|---|",
             f"| forced tool calls that parse and validate (max_tokens {max_tokens}) | {share_cell(tools)} | 100% |",
             f"| json_schema replies that validate (max_tokens {max_tokens}) | {share_cell(schemas)} | 100% |",
             f"| apply_patch calls Codex's grammar accepts, under it (max_tokens 128) | "
             f"{share_cell(patches.get('grammar'))} | 100% |",
             f"| the same, a plain string input | {share_cell(patches.get('plain'))} |  |",
             *rate_lines(rates, masks)]
    for label, c in (compiled or {}).items():  # the least of 3 cold compiles
        lines.append(f"| compile, the {c['tools']} tool schemas of a Claude Code request ({label}), "
                     f"cold | {c['schemas_ms']:.0f} ms; whole tool grammar {c['tool_grammar_ms']:.0f} ms "
                     f"| ≤ 200 ms |")
    misses = {k: v for part in (tools, schemas, *patches.values()) if part
              for k, v in part["outcomes"].items() if k != "ok"}
    return lines + (["", "Misses: " + ", ".join(f"{k} {v}" for k, v in misses.items())] if misses else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=256,
                    help="per tool and schema reply (agents ask thousands; a loop is closed "
                         "after 64 tokens of it at least)")
    ap.add_argument("--limit", type=int, default=None, help="first N prompts of each set (a quick look)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-write", action="store_true", help="print only, no bench/results JSON")
    ap.add_argument("--rates-only", type=int, metavar="ROUNDS", default=0,
                    help="only the decode rates, ROUNDS x 3 prompts a side, 96 tokens each")
    args = ap.parse_args()
    on_sigterm()
    engine = Engine("default", "cpu", max_context=4096, max_batch=1, threads=args.threads)
    if args.rates_only:
        return rates_only(engine, args)
    try:
        started = time.monotonic()
        tools = run_tools(engine.sock, args.max_tokens, args.limit)
        print("tools", json.dumps(tools), flush=True)
        schemas = run_schemas(engine.sock, args.max_tokens, args.limit)
        print("schemas", json.dumps(schemas), flush=True)
        patches = run_apply_patch(engine.sock, 128, args.limit)
        print("apply_patch", json.dumps(patches), flush=True)
        rates = run_rates(engine.sock, 48)
        print("rates", json.dumps(rates), flush=True)
        masks = mask_metrics(engine.metrics())
        print("masks", json.dumps(masks), flush=True)
        seconds = time.monotonic() - started
    finally:
        engine.stop()
    compiled = compile_claude_request()
    print("compile", json.dumps(compiled))
    if not args.no_write:
        record("structured", {
            "python": platform.python_version(), "model": "default (SmolLM2-135M-Instruct Q4_1)",
            "device": "cpu", "max_tokens": args.max_tokens, "tool_required": tools,
            "json_schema": schemas, "apply_patch": patches, "decode": rates, "masks": masks,
            "compile_claude_tools": compiled, "seconds": seconds},
            "Tool calls and structured outputs under a grammar, served, CPU (issue 27)",
            command_line(), report_lines(tools, schemas, patches, rates, masks, compiled,
                                         args.max_tokens))

if __name__ == "__main__":
    main()
