"""The frozen prompt set of bench/structured.py, built from the tool schemas real clients sent
(the recorded traffic under tests/fixtures/live-clients/ and ../shared/fixtures/live-clients/).

- `client_tools()`: every distinct function tool of that traffic as an OpenAI Chat tool
  (Anthropic `input_schema`, Chat `function.parameters`, Responses `parameters`, and the
  function tools inside a Responses `namespace`), in a stable order.
- `tool_prompts()`: 50 chat requests of 3-8 tools each (10 tool sets x 5 tasks, so the
  tools prefix is cached after each set's first prompt); descriptions cut to one sentence
  to keep prompts short on the CPU (validation reads only the schema, not descriptions).
- `schema_prompts()`: 30 `json_schema` requests: 24 tool schemas + 6 hand-written ones.
- `apply_patch()` and `EDITS`: Codex's freeform tool as recorded, and 20 edit prompts.
Everything is seeded and sorted: the same files give the same set.
"""
import copy
import gzip
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAFFIC = (ROOT / "tests" / "fixtures" / "live-clients", ROOT.parent / "shared" / "fixtures" / "live-clients")
TASKS = ("List the files in the current directory.",
         "Read the file README.md and tell me what it says.",
         "Find where the function parse_chat is defined.",
         "Run the tests and report failures.",
         "Replace 'foo' with 'bar' in main.py.")
HANDWRITTEN = (
    ("person", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
                "required": ["name", "age"], "additionalProperties": False}),
    ("weather", {"type": "object", "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"},
                 "sky": {"enum": ["sunny", "cloudy", "rain"]}}, "required": ["city", "temp_c", "sky"]}),
    ("todo", {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 4,
              "items": {"type": "string", "maxLength": 40}}}, "required": ["items"]}),
    ("verdict", {"type": "object", "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string",
                 "maxLength": 80}}, "required": ["ok", "reason"], "additionalProperties": False}),
    ("point", {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
               "required": ["x", "y"], "additionalProperties": False}),
    ("tags", {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "minItems": 2, "maxItems": 5}),
)


EDITS = ("Add a file hello.txt that says hi.", "Delete the file old.log.", "Rename main.py to app.py.",
         "In main.py, change `return 1` to `return 2`.", "Add a line `import os` at the top of util.py.",
         "Create README.md with a title 'Demo'.", "Remove the line `print(x)` from debug.py.",
         "Add a function add(a, b) to math_utils.py.", "Create .gitignore ignoring *.pyc.",
         "In config.toml set debug = true.", "Delete tests/test_old.py.", "Add a LICENSE file with MIT.",
         "Fix the typo 'teh' -> 'the' in docs/intro.md.", "Create src/__init__.py, empty.",
         "Move notes.txt to docs/notes.txt.", "Add a TODO comment to main.py.",
         "Create Makefile with a test target.", "Change the port from 80 to 8080 in server.py.",
         "Add requirements.txt listing requests.", "Replace tabs with spaces in setup.py.")


def apply_patch() -> dict | None:
    """Codex's apply_patch custom tool (its Lark grammar) from the recorded traffic."""
    for _, body in recorded_bodies():
        for tool in body.get("tools") or ():
            if tool.get("type") == "custom" and tool.get("name") == "apply_patch":
                return tool
    return None


def function_tools(tool: dict):
    if not isinstance(tool, dict):
        return
    if "input_schema" in tool:
        yield tool["name"], tool.get("description", ""), tool["input_schema"]
    elif isinstance(tool.get("function"), dict):
        fn = tool["function"]
        yield fn["name"], fn.get("description", ""), fn.get("parameters") or {"type": "object"}
    elif tool.get("type") == "function":
        yield tool["name"], tool.get("description", ""), tool.get("parameters") or {"type": "object"}
    elif tool.get("type") == "namespace":
        for inner in tool.get("tools") or ():
            yield from function_tools(inner)


def recorded_bodies():
    """Every JSON request body of the recorded client traffic, file by file."""
    for folder in TRAFFIC:
        for path in sorted(folder.glob("*.jsonl.gz")):
            with gzip.open(path, "rt") as f:
                for line in f:
                    body = json.loads(line).get("body")
                    if isinstance(body, dict):
                        yield path.name, body


def cassette_bodies():
    """(name, request body) of each recorded cassette in tests/fixtures/cassettes (not in the
    frozen prompt set: client_tools() reads the live-client traffic only)."""
    for path in sorted((ROOT / "tests" / "fixtures" / "cassettes").glob("*.json.gz")):
        with gzip.open(path, "rt") as f:
            body = json.load(f).get("request", {}).get("body")
        if isinstance(body, dict):
            yield path.name, body


def cassette_tools() -> list[dict]:
    """The 172 tools of the recorded Claude Code turn in tests/fixtures/cassettes."""
    return dict(cassette_bodies())["claude-code-turn1-tools-stream.json.gz"]["tools"]


def client_tools() -> list[tuple[str, dict]]:
    """(client file, OpenAI Chat tool) for every distinct function tool, first seen first."""
    seen, out = set(), []
    for source, body in recorded_bodies():
        for tool in body.get("tools") or ():
            for name, description, schema in function_tools(tool):
                key = (name, json.dumps(schema, sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    out.append((source, {"type": "function", "function": {
                        "name": name, "description": description, "parameters": schema}}))
    return out


def _short(text: str) -> str:
    return (text or "").split("\n")[0].split(". ")[0][:120]


def _without_descriptions(schema):
    if isinstance(schema, dict):
        return {k: _without_descriptions(v) for k, v in schema.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_without_descriptions(v) for v in schema]
    return schema


def prompt_tool(tool: dict) -> dict:
    fn = tool["function"]
    return {"type": "function", "function": {"name": fn["name"], "description": _short(fn["description"]),
                                             "parameters": _without_descriptions(fn["parameters"])}}


def tool_prompts(num_sets: int = 10) -> list[dict]:
    """50 chat bodies (no sampling fields): messages + 3-8 tools from one client's traffic."""
    by_client: dict[str, list[dict]] = {}
    for source, tool in client_tools():
        by_client.setdefault(source.split("-")[0], []).append(prompt_tool(tool))
    rng, clients = random.Random(27), sorted(c for c, tools in by_client.items() if len(tools) >= 3)
    bodies = []
    for k in range(num_sets):
        pool = by_client[clients[k % len(clients)]]
        tools = rng.sample(pool, rng.randint(3, min(8, len(pool))))
        for task in TASKS:
            bodies.append({"messages": [{"role": "user", "content": task}], "tools": tools})
    return bodies


def schema_prompts() -> list[tuple[str, dict]]:
    """30 (name, schema) pairs with their chat bodies: 24 tool schemas, then 6 hand-written."""
    picked, names = [], set()
    for _, tool in client_tools():
        fn = tool["function"]
        if fn["name"] not in names and len(picked) < 24:
            names.add(fn["name"])
            picked.append((fn["name"], _without_descriptions(fn["parameters"])))
    out = []
    for name, schema in picked + [(n, copy.deepcopy(s)) for n, s in HANDWRITTEN]:
        ask = (f"Write one JSON value for '{name}' that matches this JSON schema, and nothing else:\n"
               f"{json.dumps(schema)}")
        out.append((name, {"messages": [{"role": "user", "content": ask}], "response_format": {
            "type": "json_schema", "json_schema": {"name": name[:64], "schema": schema, "strict": False}}}))
    return out
