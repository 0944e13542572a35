"""The texts that can end a constrained string: the literal tail of each `pattern` in a schema.

A string under a pattern can close only where its regex accepts: Codex's apply_patch input
(its Lark grammar made a pattern by the proxy) only after `*** End Patch`. When a reply must
close (loop_guard.py), the loop guard offers these texts, each after a line break and then
alone, as a plan to the grammar; the first that the grammar accepts whole is written.

    literal_suffix(r"(?:a|b)+\\*\\*\\* End Patch(?:\\n)?$") == "*** End Patch"
"""
from __future__ import annotations

import re._parser as sre  # the standard library's own regex parser: its pattern tree

_SKIPPED = {sre.AT}                       # anchors: $, \Z
_REPEATS = {sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT}


def _tail(items) -> tuple[str, bool]:
    """(the literal characters every match ends with, whether the walk met no other item)."""
    chars: list[str] = []
    for op, arg in reversed(list(items)):
        if op in _SKIPPED or (op in _REPEATS and arg[0] == 0):
            continue  # matches nothing at the end in the shortest match
        if op == sre.LITERAL:
            chars.append(chr(arg))
            continue
        if op == sre.SUBPATTERN:
            inner, is_whole = _tail(arg[-1])
            chars.extend(reversed(inner))
            if is_whole:
                continue
        return "".join(reversed(chars)), False
    return "".join(reversed(chars)), True


def literal_suffix(pattern: str) -> str:
    """The literal text every match of `pattern` ends with ("" when none, or not a regex)."""
    try:
        return _tail(sre.parse(pattern))[0]
    except (sre.error, OverflowError, RecursionError):  # not a Python regex: no plan from it
        return ""


def closing_texts(schema) -> list[str]:
    """The literal suffixes of the patterns anywhere in a JSON schema, each once, in order."""
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                suffix = literal_suffix(pattern)
                if suffix.strip() and suffix not in found:
                    found.append(suffix)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return found
