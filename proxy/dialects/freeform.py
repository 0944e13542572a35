"""Codex freeform (`custom`) tools: their input grammar as a regex, so the upstream can constrain it.

A custom tool reaches a Chat upstream as a function with one string argument, `input`. When its
`format` is a regular Lark grammar (Codex's apply_patch is one) or a regex, `input_schema` puts
it in that string's JSON Schema `pattern`, anchored at both ends: an engine that constrains by
schema (kimi-engine, vLLM) then writes only inputs the grammar accepts, JSON escaping handled by
the engine's compiler. A grammar this cannot turn into a regex (a recursive rule, %ignore,
priorities, templates) keeps the plain string schema: the tool still works, unconstrained.

Lark subset: rules and terminals (`name: ...`, `NAME: ...`), alternatives `|`, groups `( )`,
optional `[ ]`, `? * +`, "literals" (with an `i` flag), /regexes/ (flags i, s), `-> alias`
(ignored), `//` comments, and `%import common.X` for the terminals in COMMON.
"""
from __future__ import annotations

import json
import re

from proxy import canonical as c
from proxy.dialects import common as d

CUSTOM_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}

COMMON = {"LF": r"\n", "CR": r"\r", "NEWLINE": r"(?:\r?\n)+", "WS": r"[ \t\f\r\n]+",
          "WS_INLINE": r"[ \t]+", "DIGIT": "[0-9]", "HEXDIGIT": "[0-9a-fA-F]", "LETTER": "[A-Za-z]",
          "INT": "[0-9]+", "WORD": "[A-Za-z]+", "CNAME": "[A-Za-z_][A-Za-z0-9_]*"}
_TOKEN = re.compile(r'\s+|//[^\n]*|(?P<str>"(?:[^"\\]|\\.)*"i?)|(?P<re>/(?:[^/\\\n]|\\.)+/[a-z]*)'
                    r"|(?P<arrow>->)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[()\[\]|?*+])")


class NotRegular(ValueError):
    """The grammar uses something a regex cannot say (or this subset does not read)."""


def custom_spec(name: str, description: str, fmt, source: str) -> c.ToolSpec:
    """A custom tool as the function the upstream sees: one string argument, `input`, under
    its grammar where it has one; the grammar's text also goes into the description."""
    fmt = fmt if isinstance(fmt, dict) else {}
    if isinstance(fmt.get("definition"), str):
        description += f"\nInput grammar ({fmt.get('syntax')}):\n{fmt['definition']}"
    constrained = input_schema(fmt)  # the grammar as the input's pattern
    schema = ({**CUSTOM_SCHEMA, "properties": {"input": constrained}, "additionalProperties": False}
              if constrained else CUSTOM_SCHEMA)
    return c.ToolSpec(name, description, schema, kind="custom", source=source)


def raw_input(arguments: str) -> str:
    """A custom call's input from the function arguments the upstream wrote: their `input`
    string (the arguments themselves when they hold none)."""
    value = d.parse_args_object(arguments).get("input")
    return value if isinstance(value, str) else arguments


def input_schema(fmt) -> dict | None:
    """A custom tool's `format` -> the JSON schema of its `input` string (None: keep the plain one)."""
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        return None
    definition, syntax = fmt.get("definition"), fmt.get("syntax")
    if not isinstance(definition, str):
        return None
    try:
        pattern = definition if syntax == "regex" else lark_to_regex(definition)
        re.compile(pattern)
    except (NotRegular, re.error):
        return None
    return {"type": "string", "pattern": f"^(?:{pattern})$"}


def lark_to_regex(text: str) -> str:
    rules = _rules(text)
    if "start" not in rules:
        raise NotRegular("no start rule")
    return _Inliner(rules).regex("start")


def _rules(text: str) -> dict[str, str]:
    """name -> its expansion text; continuation lines (starting with |) join the rule above."""
    rules: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        stripped = line.split("//")[0].strip() if '"' not in line else line.strip()
        if not stripped:
            continue
        if stripped.startswith("%import"):
            for imported in re.findall(r"common\.(\w+)", stripped) + re.findall(r"\((.*)\)", stripped):
                for item in re.split(r"[,\s]+", imported):
                    if item and item not in COMMON:
                        raise NotRegular(f"%import of {item}")
                    if item:
                        rules[item] = None  # a common terminal, resolved in _Inliner
            continue
        if stripped.startswith("%"):
            raise NotRegular(stripped.split()[0])
        head = re.match(r"^\??([A-Za-z_][A-Za-z0-9_]*)\s*:(.*)$", stripped)
        if head:
            name = head.group(1)
            rules[name] = head.group(2)
        elif stripped.startswith("|") and name:
            rules[name] += " " + stripped
        else:
            raise NotRegular(f"cannot read {stripped[:40]!r}")
    return rules


class _Inliner:
    def __init__(self, rules: dict[str, str]):
        self.rules, self.done, self.active = rules, {}, set()

    def regex(self, name: str) -> str:
        if name in self.done:
            return self.done[name]
        if self.rules.get(name) is None:
            if name in COMMON:
                return COMMON[name]
            raise NotRegular(f"undefined {name}")
        if name in self.active:
            raise NotRegular(f"{name} is recursive")
        self.active.add(name)
        matches = list(_TOKEN.finditer(self.rules[name]))
        if "".join(m.group(0) for m in matches) != self.rules[name]:
            raise NotRegular(f"cannot read rule {name}")
        tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in matches if m.lastgroup]
        out, rest = self._alternatives(tokens)
        if rest:
            raise NotRegular(f"unbalanced rule {name}")
        self.active.discard(name)
        self.done[name] = out
        return out

    def _alternatives(self, tokens):
        alts, seq = [], []
        while tokens and tokens[0] not in (("op", ")"), ("op", "]")):
            kind, value = tokens.pop(0)
            if (kind, value) == ("op", "|"):
                alts.append("".join(seq))
                seq = []
            elif kind == "arrow":
                tokens.pop(0)  # the alias name
            else:
                seq.append(self._quantified(self._atom(kind, value, tokens), tokens))
        alts.append("".join(seq))
        return (alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"), tokens

    def _quantified(self, atom: str, tokens) -> str:
        if tokens and tokens[0][0] == "op" and tokens[0][1] in "?*+":
            return f"(?:{atom}){tokens.pop(0)[1]}"
        return atom

    def _atom(self, kind: str, value: str, tokens) -> str:
        if kind == "str":
            literal = re.escape(json.loads(value.rstrip("i")))
            return f"(?i:{literal})" if value.endswith("i") else literal
        if kind == "re":
            body, flags = value[1:].rsplit("/", 1)
            if set(flags) - set("is"):
                raise NotRegular(f"regex flags {flags}")
            return f"(?{flags}:{body})" if flags else f"(?:{body})"
        if kind == "name":
            return f"(?:{self.regex(value)})"
        if value in "([":
            inner, rest = self._alternatives(tokens)
            if not rest or rest[0][1] != (")" if value == "(" else "]"):
                raise NotRegular("unbalanced brackets")
            rest.pop(0)
            return f"(?:{inner})" + ("" if value == "(" else "?")
        raise NotRegular(f"unexpected {value!r}")
