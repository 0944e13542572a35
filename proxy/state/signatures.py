"""Reasoning signatures: what a client echoes back so that its next turn gets its reasoning.

    sealer = Sealer(secret)                          # the 32 random bytes kept in the SQLite file
    sig = sealer.sign(reasoning, ledger_id, owner)   # owner: proxy.state.store.owner_of(api key)
    sealer.open(sig, owner) -> (reasoning or None, ledger id or None)     # never raises

A signature is ``klr2.<b64url(nonce ‖ AES-256-GCM(zlib(json {"r": text, "i": id})))>``: the
text rides along (restores after the ledger row is gone) and nobody without the secret can
read it, so ``thinking.display: "omitted"`` hides the reasoning from the client too. The key
is derived from the secret with HKDF-SHA256. The prefix and the owner are the associated
data: another API key's signature does not open, exactly like a forged one. Past 64 KiB
compressed (or 8 MiB of text) the text stays out and ``{"i": id}`` restores from the row
alone. Only authenticated payloads are inflated, and inflation is capped at 8 MiB anyway.

``seal``/``unseal`` with another prefix seal other payloads under the same key, bound to
the prefix as well as the owner (Responses compaction items: ``kcmp2.``).

Older forms decode to nothing: ``klr1.``/``kll1.`` (readable zlib under an HMAC) and the
public k3 proxy's unsigned ``k3r1.``/``k3l1.``. ``read_unverified`` reads them (and ours
without a key) for comparisons only, as cassette replay does; nothing it returns is trusted.
"""
from __future__ import annotations

import base64
import json
import os
import zlib

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PREFIX = "klr2."
LEGACY_TEXT_PREFIXES = ("k3r1.", "klr1.")    # zlib JSON in clear: compare-only
LEGACY_ID_PREFIXES = ("k3l1.", "kll1.")
NONCE_BYTES, GCM_TAG_BYTES = 12, 16
MAX_BLOB = 64 * 1024                         # compressed payload carried in a signature
MAX_SEALED = NONCE_BYTES + MAX_BLOB + GCM_TAG_BYTES
MAX_B64 = 4 * ((MAX_SEALED + 2) // 3)        # the longest body sign() emits
MAX_INFLATED = 8 * 1024 * 1024
KDF_INFO = b"kimi-local reasoning signature v2"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None


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


def _fields(raw: bytes | None) -> tuple[str | None, str | None]:
    """(text, ledger id) of an inflated {"r", "i"} payload; (None, None) for anything else."""
    try:
        obj = json.loads(raw) if raw is not None else None
    except ValueError:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    text, ledger_id = obj.get("r"), obj.get("i")
    return (text if isinstance(text, str) else None), (ledger_id if isinstance(ledger_id, str) and ledger_id else None)


class Sealer:
    def __init__(self, secret: bytes):
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=KDF_INFO).derive(secret)
        self._aead = AESGCM(key)

    def sign(self, reasoning: str, ledger_id: str, owner: str = "") -> str:
        raw = json.dumps({"r": reasoning, "i": ledger_id}, ensure_ascii=False, separators=(",", ":")).encode()
        blob = zlib.compress(raw, 6)
        if len(raw) > MAX_INFLATED or len(blob) > MAX_BLOB:
            blob = zlib.compress(json.dumps({"i": ledger_id}).encode())
        return self.seal(blob, owner)

    def seal(self, blob: bytes, owner: str = "", prefix: str = PREFIX) -> str:
        """``prefix`` + the sealed blob; the prefix names what it is (a token sealed as one kind
        does not open as another)."""
        nonce = os.urandom(NONCE_BYTES)
        return prefix + _b64(nonce + self._aead.encrypt(nonce, blob, _associated(owner, prefix)))

    def unseal(self, token, owner: str = "", prefix: str = PREFIX) -> bytes | None:
        """The blob seal(blob, owner, prefix) made, or None for anything else; never raises."""
        if not isinstance(token, str) or not token.startswith(prefix) or len(token) > len(prefix) + MAX_B64:
            return None
        sealed = _unb64(token[len(prefix):]) if token.isascii() else None
        if sealed is None or len(sealed) < NONCE_BYTES + GCM_TAG_BYTES:
            return None
        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _associated(owner, prefix))
        except InvalidTag:
            return None

    def open(self, signature, owner: str = "") -> tuple[str | None, str | None]:
        """(reasoning text or None, ledger id or None); (None, None) unless we sealed it for owner."""
        blob = self.unseal(signature, owner)
        return _fields(bounded_inflate(blob)) if blob is not None else (None, None)


def _associated(owner: str, prefix: str = PREFIX) -> bytes:
    return prefix.encode() + owner.encode()


def read_unverified(signature, opener=None) -> tuple[str | None, str | None]:
    """For comparisons only (cassette replay): the legacy forms read without their tag, and
    ours when ``opener`` (a Sealer's ``open``) opens them. Never use it to restore."""
    if opener is not None:
        opened = opener(signature)
        if opened != (None, None):
            return opened
    if not isinstance(signature, str) or not signature.isascii():
        return None, None
    for prefix in LEGACY_ID_PREFIXES:
        if signature.startswith(prefix):
            return None, signature[len(prefix):].split(".")[0] or None
    for prefix in LEGACY_TEXT_PREFIXES:
        if signature.startswith(prefix) and len(signature) <= len(prefix) + MAX_B64 + 32:
            blob = _unb64(signature[len(prefix):].split(".")[0])
            return _fields(bounded_inflate(blob)) if blob and len(blob) <= MAX_BLOB else (None, None)
    return None, None
