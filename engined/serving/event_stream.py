"""A sequence's events as an HTTP thread reads them: one by one, or as they come in a batch
(a verify step's tokens at once), with a client that leaves noticed between them (a failed
write, or EOF seen by a socket peek) and its sequence cancelled; and the token ids a stream
hands out chunk by chunk."""
import queue
import time

from engined.engine.sequence import ErrorEvent, FinishEvent, Sequence, TokenEvent

LIVENESS_POLL_S = 0.05


class ClientGone(Exception):
    """The client closed its connection; its generation was cancelled."""


class IdStream:
    """return_token_ids in a stream: each chunk carries the ids released since the last one;
    the final chunk carries the rest of FinishEvent.token_ids (a stop token included)."""

    def __init__(self, is_on: bool):
        self.is_on, self.pending, self.num_sent = is_on, [], 0

    def add(self, event):
        if self.is_on and isinstance(event, TokenEvent):
            self.pending.append(event.token_id)

    def take(self, finish: FinishEvent | None = None) -> dict:
        """The choice fields for the next chunk ({} when the option is off)."""
        if not self.is_on:
            return {}
        ids = list(finish.token_ids[self.num_sent:]) if finish is not None else self.pending
        self.num_sent += len(ids)
        self.pending = []
        return {"token_ids": ids}


def events(seq: Sequence, ex):
    """Yield the sequence's events up to its FinishEvent; ErrorEvent raises its error."""
    for batch in event_batches(seq, ex):
        yield from batch


def event_batches(seq: Sequence, ex):
    """Yield the sequence's events as lists, each all the events there are when the first
    came (a step that accepted drafts appends several tokens at once: a stream sends them
    in one chunk), up to its FinishEvent; ErrorEvent raises its error after the events
    before it."""
    last_check = time.monotonic()
    while True:
        try:
            batch = [seq.events.get(timeout=LIVENESS_POLL_S)]
        except queue.Empty:
            batch = []
        if time.monotonic() - last_check >= LIVENESS_POLL_S:
            last_check = time.monotonic()
            if not ex.is_client_alive():
                seq.cancel()
                raise ClientGone()
        if batch and not isinstance(batch[-1], (FinishEvent, ErrorEvent)):
            with seq.step_events:  # the rest of the step that put the first
                while not isinstance(batch[-1], (FinishEvent, ErrorEvent)):
                    try:
                        batch.append(seq.events.get_nowait())
                    except queue.Empty:
                        break
        if batch and isinstance(batch[-1], ErrorEvent):
            if batch[:-1]:
                yield batch[:-1]
            raise batch[-1].error
        if batch:
            yield batch
            if isinstance(batch[-1], FinishEvent):
                return


def start_stream(seq: Sequence, ex, text: str):
    try:
        ex.start_stream(text)
    except OSError:
        seq.cancel()
        raise ClientGone() from None


def send_events(seq: Sequence, ex, text: str, last: bool = False):
    """A write that fails means the client is gone: cancel the generation."""
    try:
        ex.end_stream(text) if last else ex.send_event(text)
    except OSError:
        seq.cancel()
        raise ClientGone() from None
