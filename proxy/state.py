"""Adapters over the persistent state: the reasoning ledger and stored Responses.

The handlers see two small interfaces:

    Reasoning: new_turn() -> ledger id;  sign(text, ledger_id) -> signature | None;
               restore(message, reasoning_field) -> upstream assistant dict | None;
               record(ledger_id, response, reasoning_field)
    Responses: get(id) -> record | None;  put(id, record);  delete(id) -> bool

They wrap `proxy.reasoning` / `proxy.store` (SQLite, next to each other in the ledger
file) and fall back to in-memory versions when those are not installed.
"""
from __future__ import annotations

import secrets
import threading
from collections import OrderedDict

from proxy import canonical as c


class MemoryReasoning:
    """No signatures, no ledger: echoed reasoning is all that comes back."""

    def new_turn(self) -> str:
        return secrets.token_hex(16)

    def sign(self, text: str, ledger_id: str) -> str | None:
        return None

    def restore(self, message: c.Message, reasoning_field: str) -> dict | None:
        return None

    def record(self, ledger_id: str, response: c.Response, reasoning_field: str) -> None:
        return None

    def close(self) -> None:
        return None


class MemoryResponses:
    """Stored Responses in a bounded in-memory LRU."""

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self._items: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> dict | None:
        with self._lock:
            record = self._items.get(response_id)
            if record is not None:
                self._items.move_to_end(response_id)
            return record

    def put(self, response_id: str, record: dict) -> None:
        with self._lock:
            self._items[response_id] = record
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def close(self) -> None:
        return None


def open_state(config: dict, metrics=None):
    """(reasoning, responses) for this app: persistent when the modules exist."""
    try:
        from proxy import reasoning as reasoning_mod, store as store_mod  # noqa: F401
    except ImportError:
        return MemoryReasoning(), MemoryResponses()
    return _persistent(config, metrics, reasoning_mod, store_mod)


def _persistent(config, metrics, reasoning_mod, store_mod):
    adapter = getattr(reasoning_mod, "open_for_proxy", None)
    if adapter is None:
        return MemoryReasoning(), MemoryResponses()
    return adapter(config, metrics)
