"""Driving the real Engine (model thread, scheduler, prefix cache) directly, without HTTP:
submit token prompts, collect the generated ids. Every wait has a timeout."""
import queue

from engined.engine.loop import Engine
from engined.metrics import EngineMetrics
from engined.engine.sequence import ErrorEvent, FinishEvent, SamplingParams, Sequence, TokenEvent

TIMEOUT_S = 120


class NullDecoder:
    def push(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


class RunningEngine:
    """with RunningEngine(model, prefix_cache_bytes=0) as engine: engine.greedy(ids, 8)"""

    def __init__(self, model, max_context: int = 8192, **options):
        self.metrics = EngineMetrics()
        self.engine = Engine(model, max_context, self.metrics, log=lambda line: None, **options)

    def __enter__(self) -> "RunningEngine":
        self.engine.start()
        return self

    def __exit__(self, *exc):
        self.engine.stop()

    def submit(self, prompt_ids: list[int], max_tokens: int, grammar=None, **params) -> Sequence:
        """Greedy unless params say otherwise (SamplingParams' fields); grammar: a
        GrammarMatcher constraining the output."""
        seq = Sequence(list(prompt_ids), SamplingParams(max_tokens, **{"temperature": 0, **params}),
                       NullDecoder())
        seq.grammar = grammar
        self.engine.submit(seq)
        return seq

    def greedy(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        return collect(self.submit(prompt_ids, max_tokens))

    def value(self, name: str, **labels) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def collect(seq: Sequence, timeout: float = TIMEOUT_S, logprobs: bool = False) -> list:
    """The token ids of a sequence's events up to its finish, or (id, logprob) pairs with
    `logprobs` (submitted with num_top_logprobs set); an ErrorEvent raises."""
    ids = []
    while True:
        try:
            event = seq.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no event from sequence {seq.seq_id} in {timeout} s") from None
        if isinstance(event, ErrorEvent):
            raise event.error
        if isinstance(event, TokenEvent):
            ids.append((event.token_id, event.logprob.logprob) if logprobs else event.token_id)
        if isinstance(event, FinishEvent):
            return ids


def both_ways(model, requests: list[tuple[list[int], int, dict]], **options):
    """Each request's (token, logprob) list with speculation off and on, submitted together
    (batched), and the on engine's drafted and accepted draft tokens. options: the Engine's
    (default: no prefix cache)."""
    results = []
    for speculative in (False, True):
        with RunningEngine(model, speculative=speculative,
                           **{"prefix_cache_bytes": 0, **options}) as engine:
            seqs = [engine.submit(p, n, num_top_logprobs=0, **params) for p, n, params in requests]
            results.append([collect(s, logprobs=True) for s in seqs])
            counts = (engine.value("kimi_engine_spec_draft_tokens_total"),
                      engine.value("kimi_engine_spec_accepted_tokens_total"))
    return results[0], results[1], counts
