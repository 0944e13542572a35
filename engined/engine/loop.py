"""The model loop: one native thread owns the model; `step()` is schedule -> run -> postprocess.

HTTP handlers build a Sequence (already tokenized) and `submit` it; the loop pushes
TokenEvent / FinishEvent / ErrorEvent onto the sequence's queue. A step (scheduler.py) is one
prefill chunk of one sequence, or one decode token for every decoding sequence at once
(continuous batching: sequences join and leave between steps). On admission a sequence
resumes from the longest cached run of whole prefill chunks of its prompt (prefix_cache.py:
chunks sit on one grid, so a warm cache gives the cold answer bit for bit); each completed
prefill chunk is added to that cache.
"""
import collections
import contextlib
import dataclasses
import threading
import time

import torch

from engined.engine import memory, penalties, sampler, speculate
from engined.errors import InternalError
from engined.metrics import EngineMetrics
from engined.models.protocol import Model
from engined.ops.torch_threads import one_torch_thread
from engined.engine.prefix_cache import PrefixCache, PrefixKeys
from engined.engine.runner import Runner
from engined.engine.speculate import Speculator
from engined.engine.scheduler import Batch, Scheduler
from engined.engine.sequence import PromptLogprobsEvent, Sequence

PREFILL_CHUNK = 256  # prompt tokens per step, so other requests keep decoding meanwhile
SCORING_CHUNK = 64  # prompt tokens per step when every row's logits are kept: [64, V] fp32
MAX_BATCH = 8  # running sequences, decoded together (the GEMV reads W once for 8 rows)
PREFIX_CACHE_BYTES = 256 * 2**20


class Engine:
    def __init__(self, model: Model, max_context: int, metrics: EngineMetrics, threads: int = 0,
                 log=print, max_batch: int = MAX_BATCH, prefill_chunk: int = PREFILL_CHUNK,
                 prefix_cache_bytes: int = PREFIX_CACHE_BYTES, max_queue: int = 0,
                 enforce_eager: bool = False, speculative: bool = True):
        self.model = model
        self.runner = Runner(model, metrics, log, max_batch=max_batch, max_context=max_context,
                             enforce_eager=enforce_eager)
        self.max_context = max_context
        self.metrics = metrics
        self.threads = threads
        self.log = log
        self.prefill_chunk = prefill_chunk
        self.scheduler = Scheduler(token_budget=max_context, max_batch=max_batch,
                                   max_queue=max_queue)
        self.prefix_cache = PrefixCache(prefix_cache_bytes, metrics, block=prefill_chunk)
        self.speculator = Speculator(metrics) if speculative and model.verifies_drafts else None
        self.step_log: collections.deque[tuple[str, tuple[int, ...]]] = collections.deque(
            maxlen=4096)  # (kind, seq ids) of recent steps: fairness is checkable
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kimi-model", daemon=True)

    def start(self):
        """Capture the decode graphs (on CUDA), then start the model thread."""
        with torch.inference_mode():
            self.runner.capture()
        self._thread.start()

    def stop(self, timeout: float = 10.0):
        self._stopping.set()
        self.scheduler.wake()
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, seq: Sequence):
        seq.seed = sampler.new_seed(seq.params.seed)
        self.scheduler.add(seq)
        self.metrics.queue_depth.set(self.scheduler.num_waiting)

    def _loop(self):
        if self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            while not self._stopping.is_set():
                self.scheduler.wait_for_work(timeout=0.5)
                try:
                    self.step()
                except Exception as exc:  # noqa: BLE001 - a bug here must not strand requests
                    self.log(f"model loop error: {exc!r}")
                    time.sleep(0.1)
        for seq in self.scheduler.drain_all():
            self._release(seq)
            seq.fail(InternalError("the engine stopped"))
        self.prefix_cache.clear()

    def step(self):
        batch = self.schedule()
        if batch is None:
            return
        try:
            logits = self.run(batch)
            with self._sampling_threads(logits):
                self.postprocess(batch, logits)
        except Exception as exc:  # a model failure ends these requests, not the daemon
            for seq in batch.seqs:
                self._fail(seq, exc)

    def schedule(self) -> Batch | None:
        for seq in self.scheduler.take_cancelled():
            self.metrics.cancelled.inc()
            self._release(seq)
        self._say_why_held()
        for seq in self.scheduler.admit():
            try:
                self._allocate(seq)
            except Exception as exc:  # no memory, or the model refused the cache size
                self.scheduler.finish(seq)
                self._release(seq)
                seq.fail(InternalError(f"cannot allocate the KV cache: {exc}"))
        self._update_gauges()
        return self.scheduler.next_batch()

    @staticmethod
    def _sampling_threads(logits: list[torch.Tensor]):
        """On the CPU, drawing from a few rows of logits runs on one torch thread (waking a
        second costs more than the copy and argmax: ops/torch_threads.py); scoring a prompt's
        rows keeps them all."""
        if logits[0].device.type == "cpu" and all(rows.shape[0] <= 8 for rows in logits):
            return one_torch_thread()
        return contextlib.nullcontext()

    def run(self, batch: Batch) -> list[torch.Tensor]:
        """-> logits per sequence ([1, V], or [T, V] while scoring a prompt), fp32 on the
        model's device: sampling happens there, and only ids and logprobs come back."""
        self.metrics.steps.labels(batch.kind).inc()
        self.step_log.append((batch.kind, tuple(s.seq_id for s in batch.seqs)))
        if batch.kind == "prefill":
            return [self.prefill(batch.seqs[0]).float()]
        self.metrics.decode_batch_size.observe(len(batch.seqs))
        logits = self.decode(batch.seqs)
        logits = logits if logits.dtype is torch.float32 else logits.float()
        if len(batch.seqs) == 1:  # no split: each torch op of a step runs cold (~5 us) on the CPU
            return [logits]
        return list(logits.split([len(s.draft) + 1 for s in batch.seqs]))

    def prefill(self, seq: Sequence) -> torch.Tensor:
        """The next chunk of the prompt into the KV cache; every row kept when scoring.
        Chunks end on multiples of the chunk size, so snapshots land on the same grid."""
        is_scoring = seq.params.is_prompt_logprobs
        size = min(self.prefill_chunk, SCORING_CHUNK) if is_scoring else self.prefill_chunk
        first = seq.num_computed
        chunk = seq.prompt_ids[first:(first // size + 1) * size]
        tokens = torch.tensor(chunk, dtype=torch.int64)  # [T]
        logits = self.model.forward(tokens, seq.cache, first, last_only=not is_scoring)
        seq.num_computed += len(chunk)
        self.metrics.prompt_tokens.inc(len(chunk))
        if seq.prefix_keys is not None:
            self.prefix_cache.store(seq.cache, seq.prefix_keys, first, seq.num_computed)
        return logits

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One token per sequence, plus the drafts a speculating one verifies (its rows at the
        next positions of its own cache): the last sampled tokens go in -> logits
        [B + drafts, V] (runner.py: a CUDA graph replay of the batch's bucket, or eager)."""
        tokens, caches, positions = [], [], []
        for seq in seqs:
            seq.draft = self.speculator.draft(seq) if self.speculator else []
            row_tokens = [seq.output_ids[-1], *seq.draft]
            tokens += row_tokens
            caches += [seq.cache] * len(row_tokens)
            positions += range(seq.num_computed, seq.num_computed + len(row_tokens))
        started = time.perf_counter()
        logits = self.runner.decode(tokens, caches, positions)
        if self.speculator:
            self.speculator.cost.timed(len(tokens), started)
        for seq in seqs:
            seq.num_computed += 1
        return logits

    def postprocess(self, batch: Batch, logits: list[torch.Tensor]):
        """Every row that ends a prompt or decodes draws its next token, in one batched call:
        a speculating sequence draws at each of its k + 1 positions."""
        drawing = [i for i, s in enumerate(batch.seqs)
                   if not s.is_prefilling and s.params.max_tokens != 0]
        ids = {}
        if drawing:
            seqs = [batch.seqs[i] for i in drawing]
            counts = [len(s.draft) + 1 for s in seqs]
            parts = [logits[i] if logits[i].shape[0] == n else logits[i][-n:]
                     for i, n in zip(drawing, counts)]
            rows = parts[0] if len(parts) == 1 else torch.cat(parts)  # [R, V]
            each = [(s, r) for s, n in zip(seqs, counts) for r in range(n)]
            rows = penalties.adjusted(rows, each)  # logit_bias and the penalties, row r after r drafts
            grammars = [g for s, n in zip(seqs, counts) for g in (
                s.grammar.draft_rows(s.draft) if s.grammar is not None and s.draft else [s.grammar] * n)]
            drawn = iter(sampler.sample_rows(
                rows, [s.params for s, _ in each], [s.seed for s, _ in each],
                [len(s.output_ids) + r for s, r in each], grammars,
                self.metrics.observe_grammar_mask))
            ids = {i: [next(drawn) for _ in range(n)] for i, n in zip(drawing, counts)}
        for i, (seq, seq_logits) in enumerate(zip(batch.seqs, logits)):
            self._postprocess_one(seq, seq_logits, ids.get(i))

    def _postprocess_one(self, seq: Sequence, logits: torch.Tensor, token_ids: list[int] | None):
        if seq.params.is_prompt_logprobs and not seq.output_ids:  # this step was a prefill
            start = seq.num_computed - logits.shape[0]
            seq.events.put(PromptLogprobsEvent(sampler.prompt_logprobs(
                logits, seq.prompt_ids, start, seq.params.num_top_logprobs or 0)))
        if seq.is_prefilling:
            return
        if seq.params.max_tokens == 0:  # scoring only (echo + logprobs)
            seq.finish("length")
        else:
            with seq.step_events:
                self._append_drawn(seq, logits, len(logits) - len(token_ids), token_ids)
        if seq.is_finished:
            self._observe_finished(seq)
            self.scheduler.finish(seq)
            self._release(seq)
            self._update_gauges()

    def _append_drawn(self, seq: Sequence, logits: torch.Tensor, first: int, token_ids: list[int]):
        """token_ids[j]: the draw after input j (the last token, then the drafts), from
        logits row first + j. Draft j stands when draw j - 1 equals it; the draws up to the
        first that does not are the sequence's next tokens, exactly those a plain decode
        draws one step at a time."""
        draft = seq.draft
        accepted = next((j for j, token_id in enumerate(draft) if token_ids[j] != token_id),
                        len(draft))
        if draft:  # counted before a token can end the request: its response reads the counts
            self.speculator.verified(seq, len(draft), accepted)
        for j in range(accepted + 1):
            self._append_sampled(seq, logits, first + j, token_ids[j])
            # a stop token, drafted or not; or a client that left during the step: it reads
            # none of the rest, and its sequence is dropped before the next step
            if seq.is_finished or seq.is_cancelled:
                break
        if draft:
            seq.num_computed += accepted  # the accepted drafts' cache rows stand
            seq.draft = []

    def _fail(self, seq: Sequence, exc: Exception):
        self.log(f"model error on request {seq.request_id}: {exc!r}")
        if seq in self.scheduler.running:
            self.scheduler.finish(seq)
        self._release(seq)
        seq.fail(InternalError(f"model error: {exc}"))

    def _append_sampled(self, seq: Sequence, logits: torch.Tensor, row: int, token_id: int):
        """token_id, drawn from logits[row] (read only for the logprobs it asks for)."""
        logprob = None
        if seq.params.num_top_logprobs is not None:
            logprob = sampler.token_logprob(logits[row], token_id, seq.params.num_top_logprobs)
        if seq.is_cancelled:
            self.metrics.tokens_after_cancel.inc()
        if seq.first_token_time is None:
            self.metrics.time_to_first_token.observe(time.monotonic() - seq.arrival_time)
        self.metrics.generated_tokens.inc()
        seq.append_token(token_id, logprob)

    def _say_why_held(self):
        """Once per request: why it waits while the batch has room (the running requests
        reserve their prompt + max_tokens of --max-context, and one without max_tokens
        reserves the rest of it)."""
        held = self.scheduler.held_for_room()
        if held is None or held[0].said_held:
            return
        seq, big = held
        seq.said_held = True
        self.log(f"request {seq.request_id or seq.seq_id} waits for KV room: it needs "
                 f"{len(seq.prompt_ids)} prompt + {seq.params.max_tokens} max_tokens, and the "
                 f"{self.scheduler.num_running} running reserve "
                 f"{self.scheduler.num_reserved_tokens} of --max-context "
                 f"{self.scheduler.token_budget} (most: request {big.request_id or big.seq_id}, "
                 f"{len(big.prompt_ids)} + {big.params.max_tokens}). Requests that set "
                 "max_tokens reserve less; a larger --max-context runs more at once")

    def _update_gauges(self):
        self.metrics.queue_depth.set(self.scheduler.num_waiting)
        self.metrics.running.set(self.scheduler.num_running)

    def _observe_finished(self, seq: Sequence):
        if seq.first_token_time is None or len(seq.output_ids) < 2:
            return
        seconds = time.monotonic() - seq.first_token_time
        if seconds > 0:
            self.metrics.decode_rate.observe((len(seq.output_ids) - 1) / seconds)

    def _allocate(self, seq: Sequence):
        try:
            self._reserve(self._kv_bytes(seq))
        except memory.MemoryCapExceeded:
            if self._kv_bytes(seq) == self._kv_bytes(seq, drafts=False):
                raise
            self._reserve(self._kv_bytes(seq, drafts=False))   # its state fits, its drafts' not:
            seq.params = dataclasses.replace(seq.params, speculative=False)  # no drafts for it
            self.log(f"request {seq.request_id}: the memory cap holds its state but not its "
                     "drafts' states; it decodes without speculation")
        try:
            seq.cache = self.model.new_cache(seq.num_max_tokens)
        except Exception:
            memory.release(self._kv_bytes(seq))
            raise
        if self.prefix_cache.is_enabled:
            self._restore_prefix(seq)

    def _restore_prefix(self, seq: Sequence):
        """Resume from the longest cached run of whole chunks; the last prompt token is always
        computed (its logits pick the first token). A scored prompt neither restores (it needs
        every row's logits) nor stores: its chunks are smaller, off the grid."""
        if not seq.params.is_prompt_logprobs:
            seq.prefix_keys = PrefixKeys(seq.prompt_ids, self.prefix_cache.block)
            seq.num_computed = self.prefix_cache.restore(seq.cache, seq.prefix_keys,
                                                         seq.num_prompt_tokens - 1)
        self.metrics.prefix_hit_tokens.inc(seq.num_computed)
        self.metrics.prefix_miss_tokens.inc(seq.num_prompt_tokens - seq.num_computed)

    def _reserve(self, num_bytes: int):
        """Reserve against the memory cap; running sequences come before cached prefixes."""
        while True:
            try:
                return memory.reserve(num_bytes)
            except memory.MemoryCapExceeded:
                if not self.prefix_cache.evict(num_bytes):
                    raise

    def _release(self, seq: Sequence):
        if seq.cache is not None:
            seq.cache = None
            memory.release(self._kv_bytes(seq))

    def _kv_bytes(self, seq: Sequence, drafts: bool = True) -> int:
        # Recurrent models (Kimi-Linear's KDA) also hold a fixed state per sequence, and a
        # speculating one a state per draft it verifies (models/kimi_cache.py's draft slots).
        most = min(speculate.K_MAX, max(0, seq.params.max_tokens - 1))   # drafts at most
        states = 1 + (most if drafts and self.speculator and seq.params.speculative else 0)
        return self.model.kv_bytes_per_token * seq.num_max_tokens + self.model.state_bytes * states
