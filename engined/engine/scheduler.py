"""What runs next: waiting sequences are admitted (at most --max-batch running) while their
KV slots fit the token budget (the --max-context the memory plan was made for). A step is
either one prefill chunk of one sequence or one decode token for every decoding sequence;
the two alternate while both have work, so no stream waits more than one prefill chunk for
its next token, and prompts take turns chunk by chunk.

At most `max_queue` sequences wait (0: no bound); `add` refuses one more with QueueFull.
`add` and `withdraw` are called by HTTP threads; everything else runs on the model thread.
"""
import collections
import threading
from dataclasses import dataclass

from engined.engine.sequence import Sequence
from engined.errors import QueueFull


@dataclass(frozen=True)
class Batch:
    kind: str  # "prefill" (one chunk of seqs[0]) | "decode" (one token for each)
    seqs: tuple[Sequence, ...]


class Scheduler:
    def __init__(self, token_budget: int, max_batch: int = 8, max_queue: int = 0):
        self.token_budget = token_budget  # KV slots shared by all running sequences
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.last_kind = "prefill"
        self.num_reserved_tokens = 0
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: collections.deque[Sequence] = collections.deque()
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add(self, seq: Sequence):
        with self._wakeup:
            if self.max_queue and len(self.waiting) >= self.max_queue:
                raise QueueFull(f"the engine's queue is full ({self.max_queue} requests "
                                "waiting to start); retry later")
            self.waiting.append(seq)
            self._wakeup.notify()

    def withdraw(self, seq: Sequence) -> bool:
        """Take a sequence that has not started off the queue; False if it has started."""
        with self._lock:
            if seq not in self.waiting:
                return False
            self.waiting.remove(seq)
            return True

    def wake(self):
        with self._wakeup:
            self._wakeup.notify()

    def wait_for_work(self, timeout: float):
        with self._wakeup:
            if not self.waiting and not self.running:
                self._wakeup.wait(timeout)

    def take_cancelled(self) -> list[Sequence]:
        """Remove cancelled sequences from both queues; the caller frees their caches."""
        with self._lock:
            cancelled = [s for s in (*self.waiting, *self.running) if s.is_cancelled]
            for seq in cancelled:
                if seq in self.waiting:
                    self.waiting.remove(seq)
                else:
                    self.running.remove(seq)
                    self.num_reserved_tokens -= seq.num_max_tokens
        return cancelled

    def can_allocate(self, seq: Sequence) -> bool:
        return not self.running or (
            len(self.running) < self.max_batch
            and self.num_reserved_tokens + seq.num_max_tokens <= self.token_budget)

    def held_for_room(self) -> tuple[Sequence, Sequence] | None:
        """(the first waiting sequence, the running one reserving the most) when the first
        waits for KV slots while the batch has a place for it; else None."""
        with self._lock:
            if not self.waiting or not self.running or len(self.running) >= self.max_batch \
                    or self.can_allocate(self.waiting[0]):
                return None
            return self.waiting[0], max(self.running, key=lambda s: s.num_max_tokens)

    def admit(self) -> list[Sequence]:
        """Move waiting sequences (in arrival order) to running while they fit."""
        admitted = []
        with self._lock:
            while self.waiting and self.can_allocate(self.waiting[0]):
                seq = self.waiting.popleft()
                self.num_reserved_tokens += seq.num_max_tokens
                self.running.append(seq)
                seq.mark_admitted()
                admitted.append(seq)
        return admitted

    def next_batch(self) -> Batch | None:
        """Alternate a prefill chunk (prompts in turn) with a decode step of all the rest."""
        with self._lock:
            prefilling = [s for s in self.running if s.is_prefilling]
            decoding = tuple(s for s in self.running if not s.is_prefilling)
            if prefilling and (not decoding or self.last_kind == "decode"):
                seq = prefilling[0]
                self.running.remove(seq)
                self.running.append(seq)  # the next prompt goes first next time
                self.last_kind = "prefill"
                return Batch("prefill", (seq,))
            if decoding:
                self.last_kind = "decode"
                return Batch("decode", decoding)
            return None

    def finish(self, seq: Sequence):
        with self._lock:
            self.running.remove(seq)
            self.num_reserved_tokens -= seq.num_max_tokens

    def drain_all(self) -> list[Sequence]:
        with self._lock:
            seqs = [*self.waiting, *self.running]
            self.waiting.clear()
            self.running.clear()
            self.num_reserved_tokens = 0
        return seqs
