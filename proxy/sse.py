"""Server-sent events: the one place that frames and decodes SSE.

Dialect modules yield `(event_name | None, payload_dict)` pairs; this module turns them
into bytes; a keep-alive is a comment frame (`COMMENT_KEEPALIVE`; handler.with_keepalive
decides when). `[DONE]` exists only for Chat Completions (`encode_done`).
"""
from __future__ import annotations

import json
DONE = b"data: [DONE]\n\n"
COMMENT_KEEPALIVE = b": keep-alive\n\n"


def dumps(obj) -> str:
    """Compact JSON with non-ASCII kept raw (what every dialect sends)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def encode(event: str | None, data) -> bytes:
    """One frame: optional `event:` line, exactly one `data:` line, blank line."""
    body = data if isinstance(data, str) else dumps(data)
    if event is None:
        return f"data: {body}\n\n".encode()
    return f"event: {event}\ndata: {body}\n\n".encode()


def encode_done() -> bytes:
    return DONE


class Decoder:
    """Incremental SSE decoder: feed bytes, get `(event, data_str)` pairs.

    Handles CRLF or LF line ends, comment lines, multi-line `data:` (joined by `\n`),
    and frames split anywhere across reads.
    """

    def __init__(self):
        self._buf = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        self._buf += chunk
        out = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return out
            line = self._buf[:nl].rstrip(b"\r").decode("utf-8", "replace")
            self._buf = self._buf[nl + 1:]
            frame = self._line(line)
            if frame is not None:
                out.append(frame)

    def flush(self) -> list[tuple[str | None, str]]:
        """At end of stream: a final frame without its blank line still counts."""
        out = []
        if self._buf:
            frame = self._line(self._buf.decode("utf-8", "replace").rstrip("\r"))
            self._buf = b""
            if frame is not None:
                out.append(frame)
        frame = self._line("")
        return out + ([frame] if frame is not None else [])

    def _line(self, line: str):
        if line == "":
            if not self._data:
                self._event = None
                return None
            frame = (self._event, "\n".join(self._data))
            self._event, self._data = None, []
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None


def parse_frames(raw: bytes) -> list[tuple[str | None, str]]:
    """Decode a complete SSE body (tests and replay)."""
    dec = Decoder()
    return dec.feed(raw) + dec.flush()
