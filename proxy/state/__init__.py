"""Adapters over the persistent state: the reasoning ledger and stored Responses.

The handlers see two small interfaces:

    Reasoning: new_turn() -> ledger id;  sign(text, ledger_id, owner) -> signature | None;
               restore(message, reasoning_field, conversation, owner) -> upstream assistant dict | None;
               record(ledger_id, response, reasoning_field, conversation, owner)
               sealer: its signatures' Sealer (Responses compaction items are sealed with it)
               (conversation: the key of the messages before the turn, proxy.state.conversation;
               for record a callable, so the hash is computed by the ledger writer)
    Responses: put(id, owner, input_items=, output_items=, previous_id=, response=);
               get(id, owner) -> response body | None;  history(id, owner) -> items | None;
               delete(id, owner) -> bool

owner is proxy.state.store.owner_of(the API key the request presented): every row and
signature is bound to it, and what another owner stored reads as unknown.

They wrap `proxy.state.reasoning` / `proxy.state.store` (one SQLite file, the ledger).
"""
from __future__ import annotations

import logging
import queue
import threading

from proxy import canonical as c

log = logging.getLogger("kimi.proxy")


class StoredResponses:
    """proxy.state.store.ResponseStore, returning the response body on get."""

    def __init__(self, store):
        self.store = store

    def put(self, response_id: str, owner: str, **kw) -> None:
        self.store.put(response_id, owner=owner, **kw)

    def get(self, response_id: str, owner: str) -> dict | None:
        stored = self.store.get(response_id, owner)
        return None if stored is None else stored.response

    def history(self, response_id: str, owner: str) -> list | None:
        return self.store.history(response_id, owner)

    def input_items(self, response_id: str, owner: str) -> list | None:
        stored = self.store.get(response_id, owner)
        return None if stored is None else stored.input_items

    def delete(self, response_id: str, owner: str) -> bool:
        return self.store.delete(response_id, owner)

    def close(self) -> None:
        return None


def _calls(calls) -> list[dict]:
    return [{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in calls]


class LedgerReasoning:
    """proxy.state.reasoning.Ledger behind the handler's interface, counting hits and misses.

    Writes happen on a writer thread (a greenlet under gevent), off the response path;
    a restore first waits for pending writes, so turn 2 always sees turn 1.
    """

    def __init__(self, ledger, metrics=None):
        self.ledger = ledger
        self.metrics = metrics
        self._pending: queue.Queue = queue.Queue()
        threading.Thread(target=self._writer, daemon=True, name="kimi-ledger-writer").start()

    @property
    def sealer(self):
        return self.ledger.sealer

    def new_turn(self) -> str:
        return self.ledger.new_id()

    def sign(self, text: str, ledger_id: str, owner: str) -> str | None:
        return self.ledger.sign(text, ledger_id, owner)

    def restore(self, message: c.Message, reasoning_field: str, conversation: str, owner: str) -> dict | None:
        from proxy.upstream.payload import assistant_from_echo
        from proxy.state.reasoning import apply_reasoning_field
        self._pending.join()
        parts = message.of(c.Reasoning)
        echoed = "".join(p.text for p in parts if not p.redacted) or None
        found = self.ledger.restore(signatures=[p.signature for p in parts if p.signature],
                                    echoed_reasoning=echoed, text=message.text(),
                                    tool_calls=_calls(message.of(c.ToolCall)), conversation=conversation,
                                    owner=owner)
        if self.metrics is not None:
            self.metrics.ledger.labels(found.source if found else "miss").inc()
        if found is None:
            return None
        plain = c.Message("assistant", tuple(p for p in message.parts if not isinstance(p, c.Reasoning)))
        base = found.message or assistant_from_echo(plain, "none") or {"role": "assistant", "content": ""}
        return apply_reasoning_field(base, found.reasoning, reasoning_field)

    def record(self, ledger_id: str, response: c.Response, reasoning_field: str, conversation, owner: str) -> None:
        """Queue one completed turn; a turn with neither reasoning nor calls has nothing to restore."""
        if not response.reasoning() and not response.tool_calls():
            return
        message = {k: v for k, v in (response.upstream_message or {}).items()
                   if k not in ("reasoning_content", "reasoning")}
        self._pending.put((ledger_id, "".join(p.text for p in response.reasoning()), response.text(),
                           _calls(response.tool_calls()), message, conversation, owner))

    def _writer(self) -> None:
        while True:
            item = self._pending.get()
            try:
                if item is None:
                    return
                ledger_id, reasoning, text, calls, message, conversation, owner = item
                self.ledger.record(ledger_id, reasoning=reasoning, text=text, tool_calls=calls, message=message,
                                   conversation=conversation() if conversation else "", owner=owner)
            except Exception as exc:  # noqa: BLE001 - a failed write must not kill the writer
                log.warning("ledger write failed: %s", exc)
            finally:
                self._pending.task_done()

    def flush(self) -> None:
        self._pending.join()

    def close(self) -> None:
        self._pending.join()
        self._pending.put(None)
        self.ledger.db.close()


def open_state(config: dict, metrics=None):
    """(reasoning, responses) for this app, in the one SQLite file at config["LEDGER"]."""
    from proxy.state.reasoning import Ledger
    from proxy.state.store import Database, ResponseStore
    db = Database(config["LEDGER"])
    ttl = config["LEDGER_TTL_S"]
    ledger = Ledger(db, max_entries=config["LEDGER_MAX_ENTRIES"], ttl_seconds=ttl)
    responses = ResponseStore(db, max_entries=config["RESPONSES_MAX_ENTRIES"], ttl_seconds=ttl)
    return LedgerReasoning(ledger, metrics), StoredResponses(responses)
