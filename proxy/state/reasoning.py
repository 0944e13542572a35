"""Reasoning restoration: signatures, a persistent ledger and a fingerprint fallback (protocols.md §5).

Clients echo our reasoning back in different ways (Anthropic ``thinking.signature``,
Responses ``reasoning.encrypted_content``, Chat ``reasoning_content``, inline ``<think>``)
or not at all. The engine needs the original reasoning (and ideally the exact original
assistant message) next turn. Per completed turn::

    ledger = Ledger(path_or_db, max_entries=100_000, ttl_seconds=30 * 86400)
    turn_id = ledger.new_id()                       # at stream start
    sig = ledger.sign(segment_text, turn_id)        # per reasoning segment, at its end
    ledger.record(turn_id, reasoning=all_text, text=visible_text, tool_calls=calls,
                  message=upstream_message)         # at stream end; message without reasoning

and for each echoed assistant message::

    restored = ledger.restore(signatures=[...], echoed_reasoning=..., text=..., tool_calls=[...])
    upstream = apply_reasoning_field(restored.message or rebuilt_message, restored.reasoning, field)

Signatures: ``klr1.<b64 zlib({"r": text, "i": id})>.<tag>`` carries the text (restores
after the ledger row is gone); past 64 KiB compressed it is ``kll1.<id>.<tag>``. The tag is
an HMAC-SHA256 (16 bytes) under a secret kept in the SQLite file, checked before anything
is inflated; inflation is capped at 8 MiB. Signatures of the public k3 proxy (``k3r1.``,
``k3l1.``) are read too, bounded the same way. Decoding never raises.

Restore order: a signature whose ledger row exists (exact message) → the texts of all
signatures → the echoed reasoning → the fingerprint of visible text + tool calls. A
fingerprint hit also supplies the exact message when its reasoning agrees with what the
signature or echo gave. Fingerprints ignore ``<think>`` spans in the text, so restoration
works under ``--reasoning-field inline`` and for clients that keep inline tags. They also
cover the conversation (proxy.state.conversation: a hash of the client-visible messages
before the turn), so two conversations with the same reply never get each other's reasoning.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import uuid
import zlib
from dataclasses import dataclass, field

from proxy.state.conversation import canonical_args
from proxy.state.store import as_database
from proxy.toolcalls.think import split_think

INLINE_PREFIX, LEDGER_PREFIX = "klr1.", "kll1."
K3_INLINE_PREFIX, K3_LEDGER_PREFIX = "k3r1.", "k3l1."
MAX_BLOB = 64 * 1024
MAX_B64 = 4 * ((MAX_BLOB + 2) // 3)          # 87,384: the longest body the encoder emits
MAX_INFLATED = 8 * 1024 * 1024
TAG_BYTES = 16
SENTINEL_FIELDS = ("none", "inline")


@dataclass(frozen=True)
class Restored:
    source: str                  # "ledger" | "fingerprint" | "signature" | "echo"
    reasoning: str
    message: dict | None = None  # the exact upstream assistant message, when known


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def bounded_inflate(blob: bytes, limit: int = MAX_INFLATED) -> bytes | None:
    """zlib-inflate with a hard output cap; None if over the cap, truncated or corrupt."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(blob, limit)
        if inflater.unconsumed_tail or not inflater.eof:
            return None
    except zlib.error:
        return None
    return out


def _payload(blob_b64: str) -> tuple[str | None, str | None]:
    if not blob_b64 or len(blob_b64) > MAX_B64:
        return None, None
    try:
        blob = _unb64(blob_b64)
    except ValueError:
        return None, None
    raw = bounded_inflate(blob) if len(blob) <= MAX_BLOB else None
    try:
        obj = json.loads(raw) if raw is not None else None
    except ValueError:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    text, ledger_id = obj.get("r"), obj.get("i")
    return (text if isinstance(text, str) else None), (ledger_id if isinstance(ledger_id, str) and ledger_id else None)


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
        self.stats = LedgerStats()

    @property
    def hits(self) -> int:
        return sum(self.stats.hits.values())

    @property
    def misses(self) -> int:
        return self.stats.misses

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    # signatures
    def _tag(self, body: str) -> str:
        return _b64(hmac.new(self.secret, body.encode(), hashlib.sha256).digest()[:TAG_BYTES])

    def sign(self, reasoning: str, ledger_id: str) -> str:
        payload = json.dumps({"r": reasoning, "i": ledger_id}, ensure_ascii=False, separators=(",", ":"))
        blob = zlib.compress(payload.encode(), 6)
        body = INLINE_PREFIX + _b64(blob) if len(blob) <= MAX_BLOB else LEDGER_PREFIX + ledger_id
        return body + "." + self._tag(body)

    def decode(self, signature) -> tuple[str | None, str | None]:
        """(reasoning text or None, ledger id or None); never raises."""
        if not isinstance(signature, str) or not signature.isascii():
            return None, None
        if signature.startswith(K3_LEDGER_PREFIX):
            return None, signature[len(K3_LEDGER_PREFIX):] or None
        if signature.startswith(K3_INLINE_PREFIX):
            return _payload(signature[len(K3_INLINE_PREFIX):])
        if not signature.startswith((INLINE_PREFIX, LEDGER_PREFIX)) or len(signature) > MAX_B64 + 64:
            return None, None
        body, _, tag = signature.rpartition(".")
        if not body or not hmac.compare_digest(tag, self._tag(body)):
            return None, None
        if body.startswith(LEDGER_PREFIX):
            return None, body[len(LEDGER_PREFIX):] or None
        return _payload(body[len(INLINE_PREFIX):])

    # ledger rows
    def record(self, ledger_id: str | None = None, *, reasoning: str, text: str = "", tool_calls=(),
               message: dict | None = None, conversation: str = "") -> str:
        """Store one completed turn; returns a signature of the whole reasoning for it."""
        ledger_id = ledger_id or self.new_id()
        now, fp = self.db.clock(), fingerprint(text, tool_calls, conversation)
        encoded = None if message is None else json.dumps(message, ensure_ascii=False)
        self.db.execute_many([
            ("UPDATE ledger SET fingerprint = NULL WHERE fingerprint = ?", (fp,)),
            ("INSERT OR REPLACE INTO ledger(id, created, used, reasoning, message, fingerprint) "
             "VALUES (?, ?, ?, ?, ?, ?)", (ledger_id, now, now, reasoning, encoded, fp)),
        ])
        self.db.evict("ledger", self.max_entries, self.ttl_seconds, lru_column="used")
        return self.sign(reasoning, ledger_id)

    def _lookup(self, column: str, value: str) -> tuple[str, dict | None] | None:
        now = self.db.clock()
        rows = self.db.execute(f"SELECT id, reasoning, message FROM ledger WHERE {column} = ? AND created >= ?",
                               (value, now - self.ttl_seconds))
        if not rows:
            return None
        row_id, reasoning, message = rows[0]
        self.db.execute("UPDATE ledger SET used = ? WHERE id = ?", (now, row_id))
        return reasoning, None if message is None else json.loads(message)

    def restore(self, *, signatures=(), echoed_reasoning: str | None = None, text: str = "",
                tool_calls=(), conversation: str = "") -> Restored | None:
        """Reasoning (and when known the exact message) for one echoed assistant message."""
        decoded = [self.decode(sig) for sig in signatures or ()]
        rows = [self._lookup("id", ledger_id) for _, ledger_id in decoded if ledger_id]
        exact = next((row for row in rows if row and row[1] is not None), None)
        if exact is not None:
            return self._hit(Restored("ledger", exact[0], exact[1]))
        texts = [t for t, _ in decoded if t is not None]
        bare_row = next((row for row in rows if row), None)
        found = (Restored("signature", "".join(texts)) if texts
                 else Restored("ledger", bare_row[0]) if bare_row
                 else Restored("echo", echoed_reasoning) if echoed_reasoning else None)
        row = (self._lookup("fingerprint", fingerprint(text, tool_calls, conversation))
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

