"""Reasoning restoration: signatures, a persistent ledger and a fingerprint fallback (protocols.md §5).

Clients echo our reasoning back in different ways (Anthropic ``thinking.signature``,
Responses ``reasoning.encrypted_content``, Chat ``reasoning_content``, inline ``<think>``)
or not at all. The engine needs the original reasoning (and ideally the exact original
assistant message) next turn. Per completed turn::

    ledger = Ledger(path_or_db, max_entries=100_000, ttl_seconds=30 * 86400)
    turn_id = ledger.new_id()                       # at stream start
    sig = ledger.sign(segment_text, turn_id, owner) # per reasoning segment, at its end
    ledger.record(turn_id, reasoning=all_text, text=visible_text, tool_calls=calls,
                  message=upstream_message, owner=owner)   # at stream end; message without reasoning

and for each echoed assistant message::

    restored = ledger.restore(signatures=[...], echoed_reasoning=..., text=..., tool_calls=[...], owner=owner)
    upstream = apply_reasoning_field(restored.message or rebuilt_message, restored.reasoning, field)

Signatures (proxy.state.signatures) are AES-GCM sealed under a secret kept in the SQLite
file and carry the text, so they restore after the ledger row is gone; they, the ledger
rows and the fingerprints are bound to an owner (proxy.state.store.owner_of: a hash of the
API key the request presented, "" for none), and another owner's never restore.

Restore order: a signature whose ledger row exists (exact message) → the texts of all
signatures → the echoed reasoning → the fingerprint of visible text + tool calls. A
fingerprint hit also supplies the exact message when its reasoning agrees with what the
signature or echo gave. Fingerprints ignore ``<think>`` spans in the text, so restoration
works under ``--reasoning-field inline`` and for clients that keep inline tags. They also
cover the conversation (proxy.state.conversation: a hash of the client-visible messages
before the turn), so two conversations with the same reply never get each other's reasoning.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field

from proxy.state.conversation import canonical_args
from proxy.state.signatures import Sealer
from proxy.state.store import as_database
from proxy.toolcalls.think import split_think

SENTINEL_FIELDS = ("none", "inline")


@dataclass(frozen=True)
class Restored:
    source: str                  # "ledger" | "fingerprint" | "signature" | "echo"
    reasoning: str
    message: dict | None = None  # the exact upstream assistant message, when known


def fingerprint(text: str, tool_calls, conversation: str = "") -> str:
    """Stable over a client's re-serialisation: the conversation's key, then the visible text
    without <think> and canonical args."""
    digest = hashlib.sha256(conversation.encode() + b"\0" + split_think(text or "")[1].strip().encode())
    for call in tool_calls or ():
        name, arguments = _call_parts(call)
        digest.update(b"\0" + name.encode() + b"\0" + canonical_args(arguments).encode())
    return digest.hexdigest()


def _call_parts(call) -> tuple[str, object]:
    if not isinstance(call, dict):
        return "", ""
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    return str(fn.get("name", "")), fn.get("arguments", fn.get("input", ""))


def apply_reasoning_field(message: dict, reasoning: str | None, field_name: str) -> dict:
    """A copy of an upstream assistant message with reasoning placed per ``--reasoning-field``.

    ``reasoning_content``/``auto`` (default) and any other name are used as the key; ``none``
    omits it; ``inline`` prefixes the content with ``<think>R</think>``. Sentinels never
    become keys. Reasoning already in the message (its keys, or ``<think>`` spans in a
    stored inline-mode content) is removed first, so it is never doubled.
    """
    out = {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning", field_name)}
    if isinstance(out.get("content"), str) and "<think>" in out["content"]:
        out["content"] = split_think(out["content"])[1]
    if not reasoning or field_name == "none":
        return out
    if field_name == "inline":
        out["content"] = f"<think>{reasoning}</think>" + (out.get("content") or "")
        return out
    out["reasoning_content" if field_name in ("", "auto") else field_name] = reasoning
    return out


@dataclass
class LedgerStats:
    hits: dict = field(default_factory=lambda: {"ledger": 0, "fingerprint": 0, "signature": 0, "echo": 0})
    misses: int = 0


class Ledger:
    def __init__(self, db, *, max_entries: int = 100_000, ttl_seconds: float = 30 * 86400,
                 secret: bytes | None = None):
        if max_entries < 1 or ttl_seconds <= 0:
            raise ValueError("ledger max_entries must be >= 1 and ttl_seconds > 0")
        self.db = as_database(db)
        self.max_entries, self.ttl_seconds = max_entries, ttl_seconds
        self.secret = secret or self.db.meta_value("signature_secret", lambda: secrets.token_bytes(32))
        self.sealer = Sealer(self.secret)
        self.stats = LedgerStats()

    @property
    def hits(self) -> int:
        return sum(self.stats.hits.values())

    @property
    def misses(self) -> int:
        return self.stats.misses

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(16)  # uuid4().hex's shape, 4 us less on every request

    # signatures
    def sign(self, reasoning: str, ledger_id: str, owner: str = "") -> str:
        return self.sealer.sign(reasoning, ledger_id, owner)

    def decode(self, signature, owner: str = "") -> tuple[str | None, str | None]:
        """(reasoning text or None, ledger id or None); never raises."""
        return self.sealer.open(signature, owner)

    # ledger rows
    def record(self, ledger_id: str | None = None, *, reasoning: str, text: str = "", tool_calls=(),
               message: dict | None = None, conversation: str = "", owner: str = "") -> str:
        """Store one completed turn for owner; returns a signature of the whole reasoning for it."""
        ledger_id = ledger_id or self.new_id()
        now, fp = self.db.clock(), fingerprint(text, tool_calls, conversation)
        encoded = None if message is None else json.dumps(message, ensure_ascii=False)
        self.db.execute_many([
            ("UPDATE ledger SET fingerprint = NULL WHERE fingerprint = ? AND owner = ?", (fp, owner)),
            ("INSERT OR REPLACE INTO ledger(id, created, used, reasoning, message, fingerprint, owner) "
             "VALUES (?, ?, ?, ?, ?, ?, ?)", (ledger_id, now, now, reasoning, encoded, fp, owner)),
        ])
        self.db.evict("ledger", self.max_entries, self.ttl_seconds, lru_column="used")
        return self.sign(reasoning, ledger_id, owner)

    def _lookup(self, column: str, value: str, owner: str) -> tuple[str, dict | None] | None:
        now = self.db.clock()
        rows = self.db.execute(f"SELECT id, reasoning, message FROM ledger WHERE {column} = ? AND owner = ? "
                               "AND created >= ?", (value, owner, now - self.ttl_seconds))
        if not rows:
            return None
        row_id, reasoning, message = rows[0]
        self.db.execute("UPDATE ledger SET used = ? WHERE id = ?", (now, row_id))
        return reasoning, None if message is None else json.loads(message)

    def restore(self, *, signatures=(), echoed_reasoning: str | None = None, text: str = "",
                tool_calls=(), conversation: str = "", owner: str = "") -> Restored | None:
        """Reasoning (and when known the exact message) for one echoed assistant message of owner's."""
        decoded = [self.decode(sig, owner) for sig in signatures or ()]
        rows = [self._lookup("id", ledger_id, owner) for _, ledger_id in decoded if ledger_id]
        exact = next((row for row in rows if row and row[1] is not None), None)
        if exact is not None:
            return self._hit(Restored("ledger", exact[0], exact[1]))
        texts = [t for t, _ in decoded if t is not None]
        bare_row = next((row for row in rows if row), None)
        found = (Restored("signature", "".join(texts)) if texts
                 else Restored("ledger", bare_row[0]) if bare_row
                 else Restored("echo", echoed_reasoning) if echoed_reasoning else None)
        row = (self._lookup("fingerprint", fingerprint(text, tool_calls, conversation), owner)
               if text or tool_calls else None)
        if row is not None and (found is None or found.reasoning == row[0]):
            return self._hit(Restored("fingerprint", row[0], row[1]))
        if found is None:
            self.stats.misses += bool(decoded or text or tool_calls)
            return None
        return self._hit(found)

    def _hit(self, restored: Restored) -> Restored:
        self.stats.hits[restored.source] += 1
        return restored

    def count(self) -> int:
        return self.db.count("ledger")

