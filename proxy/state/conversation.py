"""The conversation a turn belongs to, as a hash of what the client sees (protocols.md §5.3).

    keys = ConversationKeys(req.messages)
    keys.before(i)       # the hash of the client-visible messages before req.messages[i]
    keys.before(len(req.messages))   # the whole request: the key a reply is recorded under

Visible means roles, text (without <think> spans, stripped), tool calls (name and
canonical arguments), tool results and images; never reasoning, system messages or
anything else the client does not see as the conversation (Claude Code's billing block
is a system block). So the key a turn is recorded under equals the key its echo has on
the next turn, and two conversations with the same reply keep apart. Hashes are computed
once, incrementally and only when asked (the fingerprint fallback, the ledger writer).
"""
from __future__ import annotations

import hashlib
import json

from proxy import canonical as c
from proxy.toolcalls.think import split_think


class ConversationKeys:
    def __init__(self, messages):
        self._messages = messages
        self._digest = None
        self._keys: list[str] = []  # _keys[i]: before messages[i]

    def before(self, index: int) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256()
            self._keys.append(self._digest.hexdigest())
        while len(self._keys) <= index:
            _update(self._digest, self._messages[len(self._keys) - 1])
            self._keys.append(self._digest.hexdigest())
        return self._keys[index]


def _update(digest, msg: c.Message) -> None:
    if msg.role == "system":
        return
    digest.update(b"\x1e" + msg.role.encode())
    for part in msg.parts:
        if isinstance(part, c.Text):
            text = split_think(part.text)[1] if msg.role == "assistant" else part.text
            digest.update(b"\x1ft" + text.strip().encode())
        elif isinstance(part, c.ToolCall):
            digest.update(b"\x1fc" + part.name.encode() + b"\0" + canonical_args(part.arguments).encode())
        elif isinstance(part, c.ToolResult):
            digest.update(b"\x1fr" + str(part.is_error).encode() + part.content.strip().encode())
            for image in part.images:
                digest.update(b"\x1fi" + hashlib.sha256(image.as_url().encode()).digest())
        elif isinstance(part, c.Image):
            digest.update(b"\x1fi" + hashlib.sha256(part.as_url().encode()).digest())


def canonical_args(arguments) -> str:
    """Tool-call arguments as a client's re-serialisation cannot change them."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
