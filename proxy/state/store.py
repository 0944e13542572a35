"""The proxy's one SQLite file: reasoning ledger rows and stored Responses.

    db = Database(path)                 # creates the file 0600 (parent 0700), WAL, schema
    responses = ResponseStore(db, max_entries=10_000, ttl_seconds=30 * 86400)
    owner = owner_of(api_key)           # what a row is bound to: a hash of the key, "" for none
    responses.put("resp_1", input_items=[...], output_items=[...], previous_id=None, response={...},
                  owner=owner)
    responses.get("resp_1", owner)  -> StoredResponse | None
    responses.delete("resp_1", owner) -> bool
    responses.history("resp_2", owner) -> items of every response in the chain, oldest first:
                                          each response's input_items then its output_items

Every row carries its owner and is found only by the same owner: another key's id reads
as unknown. A file from before owners existed has its ledger and responses tables dropped
on open (rows nobody can be shown to own are never served to anyone).

``proxy.state.reasoning.Ledger`` uses the same ``Database``. Every statement runs in autocommit
mode under one lock (gevent patches it to a cooperative lock), so no transaction is ever
held across a request; several processes may share the file (busy timeout 5 s).
``default_db_path()`` is $STATE_DIRECTORY/ledger.sqlite, else
$XDG_STATE_HOME/kimi/ledger.sqlite, else ~/.local/state/kimi/ledger.sqlite.
Rows expire after ``ttl_seconds`` and the oldest are evicted past ``max_entries``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Callable

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    id TEXT PRIMARY KEY, created REAL NOT NULL, used REAL NOT NULL,
    reasoning TEXT NOT NULL, message TEXT, fingerprint TEXT, owner TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ledger_fingerprint ON ledger(fingerprint);
CREATE INDEX IF NOT EXISTS ledger_used ON ledger(used);
CREATE INDEX IF NOT EXISTS ledger_created ON ledger(created);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, created REAL NOT NULL, previous_id TEXT,
    input_items TEXT NOT NULL, output_items TEXT NOT NULL, response TEXT, owner TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_created ON responses(created);
"""
OWNED_TABLES = ("ledger", "responses")
MAX_CHAIN = 1000
SWEEP_PERIOD_S = 60.0
log = logging.getLogger("kimi.proxy")


class StoreError(Exception):
    """The state file cannot be opened or used (message names the path)."""


def default_db_path(environ=os.environ) -> pathlib.Path:
    state_dir = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state_dir:
        return pathlib.Path(state_dir) / "ledger.sqlite"
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return pathlib.Path(base) / "kimi" / "ledger.sqlite"


def owner_of(api_key: str | None) -> str:
    """The owner rows are bound to: a hash of the API key a request presented, "" for none."""
    return hashlib.sha256(b"kimi-local owner\0" + api_key.encode()).hexdigest() if api_key else ""


def create_private_file(path: pathlib.Path) -> None:
    """Create (or tighten) ``path`` as mode 0600 before SQLite opens it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class Database:
    """One SQLite connection shared by the ledger and the response store, behind a lock."""

    def __init__(self, path: str | os.PathLike, clock: Callable[[], float] = time.time):
        self.path = pathlib.Path(path)
        self.clock = clock
        self.lock = threading.Lock()
        self._rows: dict[str, int] = {}      # tracked row counts, refreshed on sweeps
        self._swept: dict[str, float] = {}   # clock() of each table's last TTL sweep
        try:
            create_private_file(self.path)
            self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self._drop_unowned_tables()
            self.conn.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open state file {self.path}: {exc}") from exc

    def _drop_unowned_tables(self) -> None:
        """A file from before rows had owners: its ledger and responses go (schema recreates them)."""
        old = [t for t in OWNED_TABLES if self._columns(t) and "owner" not in self._columns(t)]
        if not old:
            return
        self.conn.execute("BEGIN IMMEDIATE")  # another process may be upgrading the same file
        try:
            for table in old:
                if "owner" not in self._columns(table):
                    count = self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                    self.conn.execute(f"DROP TABLE {table}")
                    log.warning("%s: dropped %d %s rows stored before rows were bound to an API key",
                                self.path, count, table)
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def _columns(self, table: str) -> list[str]:
        return [row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")]

    def execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    def changed(self, sql: str, params: tuple = ()) -> int:
        """Run one write; the number of rows it changed."""
        with self.lock:
            return self.conn.execute(sql, params).rowcount

    def execute_many(self, statements: list[tuple[str, tuple]]) -> None:
        """Run a few statements atomically (one short transaction)."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self.conn.execute(sql, params)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def meta_value(self, key: str, make: Callable[[], bytes]) -> bytes:
        """The stored value for key, created once with make() (safe across processes)."""
        self.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (key, make()))
        return bytes(self.execute("SELECT value FROM meta WHERE key = ?", (key,))[0][0])

    def evict(self, table: str, max_entries: int, ttl_seconds: float, lru_column: str = "created") -> None:
        """After an insert: drop expired rows (at most once a minute) and, when the table may
        be over max_entries, the least recently used rows past it. Cheap on the common path:
        the row count is tracked here, not counted per insert."""
        now = self.clock()
        if now - self._swept.get(table, float("-inf")) >= SWEEP_PERIOD_S:
            self._swept[table] = now
            self.execute(f"DELETE FROM {table} WHERE created < ?", (now - ttl_seconds,))
            self._rows[table] = self.count(table)
        else:
            self._rows[table] = self._rows.get(table, 0) + 1
        if self._rows[table] > max_entries:
            self.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                         f"ORDER BY {lru_column} DESC, rowid DESC LIMIT -1 OFFSET ?)", (max_entries,))
            self._rows[table] = self.count(table)

    def count(self, table: str) -> int:
        return self.execute(f"SELECT COUNT(*) FROM {table}")[0][0]

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def as_database(db_or_path, clock: Callable[[], float] = time.time) -> Database:
    return db_or_path if isinstance(db_or_path, Database) else Database(db_or_path, clock)


@dataclass(frozen=True)
class StoredResponse:
    id: str
    created: float
    previous_id: str | None
    input_items: list
    output_items: list
    response: dict | None


class ResponseStore:
    """Responses kept for ``previous_response_id`` and ``GET/DELETE /v1/responses/{id}``."""

    def __init__(self, db, *, max_entries: int = 10_000, ttl_seconds: float = 30 * 86400):
        self.db = as_database(db)
        self.max_entries, self.ttl_seconds = max_entries, ttl_seconds

    def put(self, response_id: str, *, input_items: list, output_items: list,
            previous_id: str | None = None, response: dict | None = None, owner: str = "") -> None:
        row = (response_id, self.db.clock(), previous_id, json.dumps(input_items), json.dumps(output_items),
               None if response is None else json.dumps(response), owner)
        self.db.execute("INSERT OR REPLACE INTO responses(id, created, previous_id, input_items, output_items, "
                        "response, owner) VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        self.db.evict("responses", self.max_entries, self.ttl_seconds)

    def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        rows = self.db.execute("SELECT id, created, previous_id, input_items, output_items, response "
                               "FROM responses WHERE id = ? AND owner = ? AND created >= ?",
                               (response_id, owner, self.db.clock() - self.ttl_seconds))
        if not rows:
            return None
        rid, created, previous_id, inputs, outputs, response = rows[0]
        return StoredResponse(rid, created, previous_id, json.loads(inputs), json.loads(outputs),
                              None if response is None else json.loads(response))

    def delete(self, response_id: str, owner: str = "") -> bool:
        return self.db.changed("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner)) > 0

    def history(self, response_id: str, owner: str = "") -> list | None:
        """All items of the chain ending at response_id, oldest first; None if it is unknown."""
        chain: list[StoredResponse] = []
        seen: set[str] = set()
        current: str | None = response_id
        while current and current not in seen and len(chain) < MAX_CHAIN:
            seen.add(current)
            stored = self.get(current, owner)
            if stored is None:
                if not chain:
                    return None
                break
            chain.append(stored)
            current = stored.previous_id
        items: list = []
        for stored in reversed(chain):
            items += stored.input_items + stored.output_items
        return items

