"""A Sequence is one request inside the model loop: its tokens, sampling settings, KV cache,
text decoding with stop strings, and the queue its HTTP handler reads events from.

Only the model thread mutates a Sequence after `Engine.submit`; the handler reads `events`
and may call `cancel()` (a thread-safe flag).
"""
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

_ids = itertools.count(1)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    num_top_logprobs: int | None = None  # None = no logprobs; 0 = the chosen token's only
    is_prompt_logprobs: bool = False  # /v1/completions echo + logprobs
    speculative: bool = True  # drafts verified when the model can (engine/speculate.py)
    presence_penalty: float = 0.0  # the four below: engine/penalties.py
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    min_p: float = 0.0  # a drawn token's probability >= min_p x the most likely one's
    min_tokens: int = 0  # no stop token (masked) or stop string before this many tokens
    kept_stops: tuple[str, ...] = ()  # stop strings returned with the text that they end
    allowed_token_ids: frozenset[int] = frozenset()  # only these may be drawn (empty: all)
    prediction_ids: tuple[int, ...] = ()  # the client's predicted output: drafts look it up too

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def penalizes(self) -> bool:
        """Whether the output so far changes the logits (a penalty is set)."""
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float | None  # None for the first prompt token, which has no context
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str  # decoded text released by this token ("" while held back)
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class PromptLogprobsEvent:
    entries: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class FinishEvent:
    reason: str  # "stop" | "length" | "cancelled"
    text: str  # text released at the end (held-back text that turned out not to stop)
    num_prompt_tokens: int
    num_completion_tokens: int
    stop_string: str | None = None  # the stop string that ended the text, if one did
    token_ids: tuple[int, ...] = ()  # every generated id, a stop token included


@dataclass(frozen=True)
class ErrorEvent:
    error: Exception


class StopMatcher:
    """Finds stop strings across token boundaries, holding back text that could start one."""

    def __init__(self, stops: tuple[str, ...], kept: tuple[str, ...] = ()):
        self.stops = tuple(s for s in stops if s)
        self.kept = kept  # stops released with the text (include_stop_str_in_output)
        self.pending = ""
        self.hit: str | None = None  # the stop string found, once one is

    def push(self, text: str) -> tuple[str, bool]:
        """-> (text safe to release, whether a stop string was hit)."""
        buf = self.pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            self.hit = min((buf.find(s), s) for s in self.stops if s in buf)[1]
            return buf[:min(hits) + (len(self.hit) if self.hit in self.kept else 0)], True
        hold = max((n for s in self.stops for n in range(1, len(s)) if buf.endswith(s[:n])),
                   default=0)
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    decoder: object  # IncrementalDecoder: push(id) -> str, flush() -> str
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens already in the KV cache
    cache: object = None
    prefix_keys: object = None  # prefix_cache.PrefixKeys of the prompt, when caching
    grammar: object = None  # grammar.matcher.GrammarMatcher constraining the output, or None
    draft: list[int] = field(default_factory=list)  # tokens this decode step verifies
    spec: object = None  # (lookup.PromptLookup, speculate.DraftLength) once it drafts
    history: object = None  # penalties.History once a penalized step has run
    seed: int = 0  # int64 draw seed (the request's, else random), set by the engine
    said_held: bool = False  # the engine logged why it waits for KV room (once)
    finish_reason: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finish_time: float | None = None
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    # held by the model thread while it appends one step's tokens (several when drafts
    # stood): a reader that takes it after its first event then finds the step's events whole
    step_events: threading.Lock = field(default_factory=threading.Lock)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _admitted: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self.stop_matcher = StopMatcher(self.params.stop, self.params.kept_stops)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_max_tokens(self) -> int:
        """KV cache slots this sequence may need: prompt + completion."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self):
        """Called by the HTTP handler when its client went away."""
        self._cancelled.set()

    def mark_admitted(self):
        """Called by the scheduler when the sequence leaves the queue to run."""
        self._admitted.set()

    def wait_admitted(self, timeout: float) -> bool:
        """For the HTTP handler: True once the sequence has left the queue to run."""
        return self._admitted.wait(timeout)

    def append_token(self, token_id: int, logprob: TokenLogprob | None):
        """Record a sampled token; decide whether the sequence is finished."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_ids.append(token_id)
        if self.grammar is not None:
            self.grammar.advance(token_id)  # the next mask is computed while the model runs
        if token_id in self.params.stop_token_ids:
            return self.finish("stop")  # the stop token counts but has no text or logprob
        text = self.decoder.push(token_id)
        if len(self.output_ids) < self.params.min_tokens:  # no stop string yet (vLLM's rule)
            is_stop = False
        else:
            text, is_stop = self.stop_matcher.push(text)
        if is_stop:
            self.events.put(TokenEvent(token_id, text, logprob))
            return self.finish("stop", flush=False)
        self.events.put(TokenEvent(token_id, text, logprob))
        if len(self.output_ids) >= self.params.max_tokens:
            self.finish("length")

    def finish(self, reason: str, flush: bool = True):
        tail = ""
        if flush:
            tail, is_stop = self.stop_matcher.push(self.decoder.flush())
            tail += "" if is_stop else self.stop_matcher.flush()
        self.finish_reason = reason
        self.finish_time = time.monotonic()
        self.events.put(FinishEvent(reason, tail, len(self.prompt_ids), len(self.output_ids),
                                    self.stop_matcher.hit, tuple(self.output_ids)))

    def fail(self, error: Exception):
        self.finish_reason = "error"
        self.finish_time = time.monotonic()
        self.events.put(ErrorEvent(error))
