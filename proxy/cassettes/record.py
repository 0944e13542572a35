"""`--record DIR`: cassettes written off the request path, mode 0600 (they hold prompts).

The format is protocols.md §10.1 (`k3_cassette: 1`), so `kimi-proxy replay` and the
cassette tests read recorded and shipped cassettes alike. Credentials are redacted.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import threading
import time

log = logging.getLogger("kimi.proxy")
REDACT = {"authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie", "openai-organization"}


def redact(headers: dict) -> dict:
    return {k.lower(): ("<redacted>" if k.lower() in REDACT else v) for k, v in headers.items()}


REPLAY_KEYS = ("CLIENT", "TOOL_PARSER", "REASONING_FIELD", "MODEL", "MODEL_ALIAS", "SMALL_MODEL")


def served(info: dict) -> dict:
    """The served model's id (the payload's model) and whether it reads text only."""
    return {k: info[k] for k in ("id", "text_only") if k in info}


def cassette(ex, config: dict | None = None) -> dict:
    streamed = isinstance(ex.frames, list)
    info = getattr(ex, "request_info", None) or {}
    return {
        "k3_cassette": 1, "name": "", "recorded_at": time.time(), "source": "recorded",
        "preset": ex.policy.preset if ex.policy else "", "detected_via": ex.policy.reason if ex.policy else "",
        "streamed": streamed,
        "proxy_config": {k: (config or {}).get(k) for k in REPLAY_KEYS},  # what replay must reuse
        "served": served(ex.services.served_info()),  # what of the upstream's card shaped the payload
        "request": {"path": info.get("path", ex.route), "headers": redact(info.get("headers", {})),
                    "body": info.get("body")},
        "upstream": {"request": ex.payload, "chunks": ex.chunks if streamed else [],
                     "response": None if streamed else ex.upstream_response},
        "client": {"status": ex.status, "body": None if streamed else ex.frames,
                   "sse": [f.decode("utf-8", "replace") for f in ex.frames] if streamed else []},
    }


class Recorder:
    def __init__(self, directory: str, config: dict | None = None, max_pending: int = 256):
        self.directory = directory
        self.config = config or {}
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, daemon=True, name="kimi-proxy-recorder")
        self._thread.start()

    def submit(self, ex) -> None:
        try:
            self._queue.put_nowait(cassette(ex, self.config))
        except queue.Full:
            log.warning("recorder is behind; a cassette was dropped")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.write(item)
            except OSError as exc:
                log.warning("cannot write cassette: %s", exc)
            finally:
                self._queue.task_done()

    def write(self, item: dict) -> str:
        kind = "stream" if item["streamed"] else "json"
        slug = item["request"]["path"].strip("/").replace("/", "-") or "root"
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{item['preset']}-{slug}-{kind}-{secrets.token_hex(3)}"
        item["name"] = name
        path = os.path.join(self.directory, name + ".json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(item, f, ensure_ascii=False)
        return path

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
