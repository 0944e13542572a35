"""Validate OpenAI Chat shaped messages and tools into plain dicts a template can read.

Every rejection is a ChatInputError naming the offending field, e.g. `messages[2].role`.
"""
from __future__ import annotations

import json

from engined.chat.errors import ChatInputError

ROLES = ("system", "developer", "user", "assistant", "tool")


def _text(content, where: str) -> str | None:
    """A string, None, or a list of text parts joined by newlines (as vLLM joins them)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatInputError(f"{where} must be a string, null or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise ChatInputError(f"{where}[{j}] must be an object like {{\"type\": \"text\", \"text\": ...}}")
        if part.get("type") != "text":
            raise ChatInputError(f"{where}[{j}].type {part.get('type')!r} is not supported: this model reads text only")
        if not isinstance(part.get("text"), str):
            raise ChatInputError(f"{where}[{j}].text must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _arguments(arguments, where: str) -> str:
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise ChatInputError(f"{where} must be a JSON string")
    return arguments


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise ChatInputError(f"{where} must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatInputError(f"{where}[{j}] must look like {{\"type\": \"function\", \"function\": {{\"name\": ..., \"arguments\": ...}}}}")
        if call.get("type", "function") != "function":
            raise ChatInputError(f"{where}[{j}].type {call.get('type')!r} is not supported; use 'function'")
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"],
                                 "arguments": _arguments(fn.get("arguments", "{}"), f"{where}[{j}].function.arguments")}})
    return out


def _message(message, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ChatInputError(f"{where} must be an object with a role and content")
    role = message.get("role")
    if role not in ROLES:
        raise ChatInputError(f"{where}.role {role!r} is not one of {', '.join(ROLES)}")
    role = "system" if role == "developer" else role
    content = _text(message.get("content"), f"{where}.content")
    out = {"role": role, "content": content}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
    elif content is None and role != "assistant":
        raise ChatInputError(f"{where}: a {role} message needs content")
    elif content is None:
        raise ChatInputError(f"{where}: an assistant message needs content or tool_calls")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise ChatInputError(f"{where}.tool_call_id must be a string")
        out["tool_call_id"] = call_id or ""
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def normalize_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ChatInputError("messages must be a non-empty list")
    return [_message(message, i) for i, message in enumerate(messages)]


def normalize_tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatInputError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ChatInputError(f"tools[{i}] must look like {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatInputError(f"tools[{i}].function.name must be a non-empty string")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise ChatInputError(f"tools[{i}].function.parameters must be a JSON schema object")
        if "description" in fn and not isinstance(fn["description"], str):
            raise ChatInputError(f"tools[{i}].function.description must be a string")
        out.append({"type": "function", "function": dict(fn)})
    return out or None


def forced_tool(tool_choice, tools: list[dict] | None) -> str | None:
    """None, 'auto', 'none', 'required' or {"type": "function", "function": {"name": N}}:
    returns '' for no constraint, '*' for any tool, the name for one tool; None means no tools."""
    if tool_choice in (None, "auto"):
        return "" if tools else None
    if tool_choice == "none":
        return None
    names = [tool["function"]["name"] for tool in tools or ()]
    if tool_choice == "required":
        if not names:
            raise ChatInputError("tool_choice 'required' needs tools")
        return "*"
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ChatInputError("tool_choice must be 'none', 'auto', 'required' or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if fn["name"] not in names:
        raise ChatInputError(f"tool_choice names {fn['name']!r}, which is not in tools")
    return fn["name"]


def allowed_tools(tools, tool_choice) -> tuple:
    """(tools, tool_choice) -> the same, or for OpenAI's {"type": "allowed_tools",
    "allowed_tools": {"mode": "auto" | "required", "tools": [{"type": "function", "function":
    {"name"}}, ...]}}: the tools it lists, in the request's order, and its mode."""
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "allowed_tools"):
        return tools, tool_choice
    spec = tool_choice.get("allowed_tools")
    refs = spec.get("tools") if isinstance(spec, dict) else None
    if not isinstance(refs, list) or not refs or spec.get("mode") not in ("auto", "required"):
        raise ChatInputError("tool_choice.allowed_tools needs mode ('auto' or 'required') and a "
                             "non-empty list of tools")
    names = set()
    for i, ref in enumerate(refs):
        fn = ref.get("function") if isinstance(ref, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ChatInputError(f"tool_choice.allowed_tools.tools[{i}] must be "
                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        names.add(fn["name"])
    kept = [t for t in normalize_tools(tools) or () if t["function"]["name"] in names]
    missing = sorted(names - {t["function"]["name"] for t in kept})
    if missing:
        raise ChatInputError(f"tool_choice.allowed_tools lists {missing[0]!r}, which is not in tools")
    return kept, spec["mode"]


CONTINUE_MARK = "\U000f0000kimi:continue\U000f0000"  # private-use: no text or markup has it


def marked_final(messages: list[dict]) -> list[dict]:
    """Normalized messages whose final text ends with CONTINUE_MARK, for open_final to cut
    at: the cut is where the template put the text's end, whatever it trims, repeats or
    wraps around it (searching the rendered prompt for the text itself cut inside an earlier
    message under a trimming template, and closed the turn for a text like ">" or "\n").
    A final message without text, or with tool calls, cannot be continued: ChatInputError."""
    final = messages[-1]
    if final.get("tool_calls"):
        raise ChatInputError("messages[-1]: continue_final_message continues text, and this "
                             "message holds tool calls (send it without the flag)")
    if not (final.get("content") or "").strip():
        raise ChatInputError("messages[-1].content: continue_final_message needs a final message "
                             "with text to continue; this one has none (send the request without "
                             "it to start a new reply)")
    return [*messages[:-1], {**final, "content": final["content"] + CONTINUE_MARK}]


def open_final(rendered: str) -> str:
    """The prompt rendered from marked_final's messages, cut where the mark is: the reply
    continues the final message's text (vLLM's continue_final_message)."""
    if rendered.count(CONTINUE_MARK) != 1:
        raise ChatInputError("messages[-1].content: the chat template changed the final "
                             "message's text, so it cannot be continued (send the request "
                             "without continue_final_message)")
    return rendered[:rendered.index(CONTINUE_MARK)]
