"""Which sequence runs next: waiting ones are admitted while their KV slots fit the token
budget (the --max-context the memory plan was made for), running ones take turns, one
prefill chunk or one decode token per step.

`add` is called by HTTP threads; everything else runs on the model thread.
"""
import collections
import threading

from engined.sequence import Sequence


class Scheduler:
    def __init__(self, token_budget: int):
        self.token_budget = token_budget  # KV slots shared by all running sequences
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
            self.waiting.append(seq)
            self._wakeup.notify()

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
        return (not self.running
                or self.num_reserved_tokens + seq.num_max_tokens <= self.token_budget)

    def admit(self) -> list[Sequence]:
        """Move waiting sequences (in arrival order) to running while they fit."""
        admitted = []
        with self._lock:
            while self.waiting and self.can_allocate(self.waiting[0]):
                seq = self.waiting.popleft()
                self.num_reserved_tokens += seq.num_max_tokens
                self.running.append(seq)
                admitted.append(seq)
        return admitted

    def next(self) -> Sequence | None:
        """Round robin: the head runs this step, then goes to the back."""
        with self._lock:
            if not self.running:
                return None
            seq = self.running[0]
            self.running.rotate(-1)
            return seq

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
