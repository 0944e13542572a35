"""An upstream call in progress: a streamed response, and the handle that cancels a call."""
from __future__ import annotations

from proxy import fastjson, sse
from proxy.errors import ClientGone, UpstreamError
from proxy.upstream.http11 import Connection
from proxy.upstream.status import error_of, is_overflow


class Cancel:
    """Lets another greenlet abort one upstream call (its client left): cancel() closes the
    call's connection, which wakes its reader and makes the engine drop the request.
    No lock: no method blocks, so greenlets cannot interleave inside one (a lock cost 5 us
    a request under gevent)."""

    __slots__ = ("_conn", "is_cancelled")

    def __init__(self):
        self._conn: Connection | None = None
        self.is_cancelled = False

    def attach(self, conn: Connection) -> None:
        if self.is_cancelled:
            raise ClientGone("the client closed its connection")
        self._conn = conn

    def detach(self) -> None:
        """Before the connection goes back to the pool: it is no longer this call's to close."""
        self._conn = None

    def cancel(self) -> None:
        self.is_cancelled = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class Stream:
    """An open streamed upstream response: iterate for chunk dicts; close() cancels.

    The stream ends at `[DONE]`, or at the end of the body once a finish reason came
    (servers that send no `[DONE]`); a body that ends before either is an error. SGLang
    refuses a prompt too long for its context inside a stream it already began: that error
    is the overflow, as it would be before the stream."""

    def __init__(self, upstream, conn, resp, cancel: Cancel | None = None, messages: list | None = None):
        self._upstream, self._conn, self._resp, self._cancel = upstream, conn, resp, cancel
        self._messages = messages
        self._done = False

    def __iter__(self):
        dec = sse.Decoder()
        pieces = self._resp.pieces()
        is_finished = False
        refused = self._refused
        try:
            while True:
                try:
                    data = next(pieces, b"")
                except OSError as exc:
                    raise UpstreamError(f"upstream stream broke: {exc}") from exc
                frames = dec.feed(data) if data else dec.flush()
                for _event, payload in frames:
                    if payload.strip() == "[DONE]":
                        self._done = True
                        return
                    chunk = _decode_chunk(payload, refused)
                    is_finished = is_finished or _has_finish(chunk)
                    yield chunk
                if not data:
                    if is_finished:  # a clean end of the body after finish_reason: no [DONE] needed
                        self._done = True
                        return
                    raise UpstreamError("upstream closed the stream before it finished")
        finally:
            self.close()

    def _refused(self, error: dict):
        return self._upstream.refused(400, {"error": error}, {}, {"messages": self._messages})

    def close(self):
        """Release a finished connection; abort an unfinished one (cancels the engine request)."""
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._cancel is not None:
            self._cancel.detach()
        if self._done and not self._resp.will_close:
            try:  # drain the terminating chunk so the connection can be reused
                if not self._resp.is_complete:
                    self._resp.read()
                self._upstream._release(conn)
                return
            except OSError:
                pass
        conn.close()


class ListStream(list):
    """Chunks already in hand, with the Stream interface."""

    def close(self):
        pass


def _has_finish(chunk: dict) -> bool:
    choices = chunk.get("choices")
    return isinstance(choices, list) and any(isinstance(ch, dict) and ch.get("finish_reason")
                                             for ch in choices)


def _decode_chunk(payload: str, refused=None) -> dict:
    try:
        chunk = fastjson.loads(payload)
    except ValueError as exc:
        raise UpstreamError(f"upstream sent a chunk that is not JSON: {payload[:200]!r}") from exc
    if not isinstance(chunk, dict):
        raise UpstreamError("upstream sent a chunk that is not a JSON object")
    if ("error" in chunk or chunk.get("object") == "error") and not chunk.get("choices"):
        err = error_of(chunk)
        msg = str(err.get("message")) if err is not None else str(chunk.get("error"))
        if err is not None and refused is not None and is_overflow(400, err, msg):
            raise refused(err)
        raise UpstreamError(f"upstream error mid-stream: {msg}")
    return chunk
