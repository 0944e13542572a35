"""The cassette allowlist: differences a replay may show, each tied to a requirement.

Entries: {"side": "upstream"|"client"|"status", "path": regex over the diff path (or a
JSON path for "superset"), "kind", "requirement"}. Kinds: any, missing (the recorded
value, as JSON, holds `value` when given), unexpected, whitespace (equal once whitespace
runs are squashed, after removing the regex `drop` from the start of the recorded value),
text-parts (a string became text parts with the same text), prefix (replayed = value +
recorded), superset (the recorded list is a subsequence of the replayed list).
"""
from __future__ import annotations

import json
import re

MISSING, UNEXPECTED = "<missing>", "<unexpected>"


def _resolve(doc, path: str):
    for key in re.findall(r"\.([A-Za-z_]+)|\[(\d+)\]", path):
        if doc is None:
            return None
        doc = doc.get(key[0]) if key[0] and isinstance(doc, dict) else (
            doc[int(key[1])] if key[1] and isinstance(doc, list) and int(key[1]) < len(doc) else None)
    return doc


def _is_subsequence(small, big) -> bool:
    it = iter(big or [])
    return isinstance(small, list) and all(any(x == y for y in it) for x in small)


def _allowed(d: tuple, entry: dict, docs: dict) -> bool:
    path, a, b = d
    kind = entry.get("kind", "any")
    if kind == "superset":  # the recorded list is a subsequence of the replayed one
        if not path.startswith(entry["path"]):
            return False
        rec, rep = docs.get(entry["side"], (None, None))
        return _is_subsequence(_resolve(rec, entry["path"]), _resolve(rep, entry["path"]))
    if not re.fullmatch(entry["path"], path):
        return False
    squash = lambda x: re.sub(r"\s+", " ", x).strip() if isinstance(x, str) else x  # noqa: E731
    if isinstance(a, str) and entry.get("drop"):
        a = re.sub("^" + entry["drop"], "", a, count=1)
    return {"any": True, "missing": b is MISSING and entry.get("value", "") in json.dumps(a),
            "unexpected": a is UNEXPECTED,
            "whitespace": isinstance(a, str) and isinstance(b, str) and squash(a) == squash(b),
            "text-parts": isinstance(a, str) and isinstance(b, list) and a == "".join(
                p.get("text", "") for p in b if isinstance(p, dict)),
            "prefix": isinstance(b, str) and b == entry.get("value", "") + str(a)}.get(kind, False)


def unexplained(result: dict, entries: list[dict]) -> list[tuple[str, tuple]]:
    """The differences no allowlist entry explains, as (part, difference)."""
    docs = result.get("docs", {})
    return [(part, d) for part in ("status", "upstream", "client") for d in result[part]
            if not any(e["side"] == part and _allowed(d, e, docs) for e in entries)]
