"""Tools for a chat template that has none (SmolLM2's): the hermes convention, in text.

- Tool schemas go into the system message, inside <tools></tools>, one JSON per line,
  with an instruction to answer with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
- An assistant's earlier tool_calls become that same <tool_call> text in its turn.
- Tool results become <tool_response>...</tool_response> blocks inside one user turn.
The output parser (output.py) reads the <tool_call> blocks back into native tool calls.
"""
from __future__ import annotations

import json

TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to help with the user's request. "
    "The functions are described as JSON schemas inside <tools></tools>:\n<tools>\n")
TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "To call a function, answer with one JSON object per call, each inside <tool_call></tool_call> tags:\n"
    "<tool_call>\n"
    "{\"name\": \"<function-name>\", \"arguments\": <arguments-as-a-JSON-object>}\n"
    "</tool_call>")


def tools_prompt(tools: list[dict], forced: str) -> str:
    """forced: '' (model decides), '*' (must call one), or a function name (must call it)."""
    schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    prompt = TOOLS_HEADER + schemas + TOOLS_FOOTER
    if forced == "*":
        prompt += "\n\nYou must answer with at least one function call."
    elif forced:
        prompt += f"\n\nYou must answer by calling the function {json.dumps(forced, ensure_ascii=False)}."
    return prompt


def tool_call_text(call: dict) -> str:
    """The arguments keep the caller's bytes when they are JSON; anything else is quoted."""
    name = json.dumps(call["function"]["name"], ensure_ascii=False)
    arguments = call["function"]["arguments"]
    try:
        json.loads(arguments)
    except ValueError:
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"<tool_call>\n{{\"name\": {name}, \"arguments\": {arguments}}}\n</tool_call>"


def _assistant(message: dict) -> dict:
    calls = "\n".join(tool_call_text(call) for call in message.get("tool_calls", ()))
    content = message["content"] or ""
    text = f"{content}\n{calls}" if content and calls else content or calls
    return {"role": "assistant", "content": text}


def render_history(messages: list[dict], tools: list[dict] | None, forced: str | None) -> list[dict]:
    """Plain {role, content: str} messages with tools, tool calls and results in hermes text."""
    out: list[dict] = []
    is_tool_turn = False    # consecutive tool results share one user turn
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if is_tool_turn:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append(_assistant(message) if role == "assistant" else {"role": role, "content": content})
        is_tool_turn = role == "tool"
    if tools and forced is not None:
        prompt = tools_prompt(tools, forced)
        if out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
