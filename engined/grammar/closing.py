r"""The texts that can end a constrained string: the literal tail of each `pattern` in a schema.

A string under a pattern can close only where its regex accepts: Codex's apply_patch input
(its Lark grammar made a pattern by the proxy) only after `*** End Patch`. When a reply must
close (loop_guard.py), the loop guard offers these texts, in order, to the grammar; the first
that it accepts whole is written. For each pattern: its tail after a line break, the tail
alone, then the tail after a one-character line (`+` ends an added file's required line),
with that line first ended or not, for each character the pattern names literally.

    literal_suffix(r"(?:a|b)+\*\*\* End Patch(?:\n)?$") == "*** End Patch"
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
            if chars:  # optional text between: what comes before it is not always there
                return "".join(reversed(chars)), False
            continue  # at the very end: matches nothing in the shortest match
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


def literal_chars(pattern: str) -> list[str]:
    """The printable characters `pattern` names literally anywhere, sorted."""
    found: set[str] = set()

    def walk(items):
        for op, arg in items:
            if op == sre.LITERAL:
                found.add(chr(arg))
            elif op == sre.SUBPATTERN:
                walk(arg[-1])
            elif op in _REPEATS:
                walk(arg[2])
            elif op == sre.BRANCH:
                for branch in arg[1]:
                    walk(branch)

    try:
        walk(sre.parse(pattern))
    except (sre.error, OverflowError, RecursionError):
        return []
    return sorted(c for c in found if c.isprintable())


def closing_texts(schema) -> list[str]:
    """The texts that may close the pattern-constrained strings anywhere in a JSON schema, the
    likeliest first, each once."""
    found: list[str] = []

    def add(pattern: str):
        tail = literal_suffix(pattern)
        if not tail.strip():
            return
        chars = literal_chars(pattern)
        for text in ["\n" + tail, tail, *(c + "\n" + tail for c in chars),
                     *("\n" + c + "\n" + tail for c in chars)]:
            if text not in found:
                found.append(text)

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                add(node["pattern"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return found
