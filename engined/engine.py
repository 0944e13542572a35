"""The model loop: one native thread owns the model; `step()` is schedule -> run -> postprocess.

HTTP handlers build a Sequence (already tokenized) and `submit` it; the loop pushes
TokenEvent / FinishEvent / ErrorEvent onto the sequence's queue.
"""
import threading
import time

import torch

from engined import helper, sampler
from engined.errors import InternalError
from engined.metrics import EngineMetrics
from engined.scheduler import Scheduler
from engined.sequence import PromptLogprobsEvent, Sequence

PREFILL_CHUNK = 256  # prompt tokens per step, so other requests keep decoding meanwhile
SCORING_CHUNK = 64  # prompt tokens per step when every row's logits are kept: [64, V] fp32


class Engine:
    def __init__(self, model, max_context: int, metrics: EngineMetrics, threads: int = 0,
                 log=print):
        self.model = model
        self.max_context = max_context
        self.metrics = metrics
        self.threads = threads
        self.log = log
        self.scheduler = Scheduler(token_budget=max_context)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kimi-model", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self, timeout: float = 10.0):
        self._stopping.set()
        self.scheduler.wake()
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, seq: Sequence):
        seq.generator = sampler.new_generator(seq.params.seed)
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

    def step(self):
        seq = self.schedule()
        if seq is None:
            return
        try:
            logits = self.run(seq)
            self.postprocess(seq, logits)
        except Exception as exc:  # a model failure ends this request, not the daemon
            self.log(f"model error on request {seq.request_id}: {exc!r}")
            if seq in self.scheduler.running:
                self.scheduler.finish(seq)
            self._release(seq)
            seq.fail(InternalError(f"model error: {exc}"))

    def schedule(self) -> Sequence | None:
        for seq in self.scheduler.take_cancelled():
            self.metrics.cancelled.inc()
            self._release(seq)
        for seq in self.scheduler.admit():
            try:
                self._allocate(seq)
            except Exception as exc:  # no memory, or the model refused the cache size
                self.scheduler.finish(seq)
                seq.fail(InternalError(f"cannot allocate the KV cache: {exc}"))
        self._update_gauges()
        return self.scheduler.next()

    def run(self, seq: Sequence) -> torch.Tensor:
        """-> logits [1, V] (or [T, V] while scoring a prompt), on the CPU for the sampler."""
        logits = self.prefill(seq) if seq.is_prefilling else self.decode(seq)
        return logits.float().cpu()

    def prefill(self, seq: Sequence) -> torch.Tensor:
        """The next chunk of the prompt into the KV cache; every row kept when scoring."""
        is_scoring = seq.params.is_prompt_logprobs
        chunk = seq.prompt_ids[seq.num_computed:
                               seq.num_computed + (SCORING_CHUNK if is_scoring else PREFILL_CHUNK)]
        tokens = torch.tensor(chunk, dtype=torch.int64)  # [T]
        logits = self.model.forward(tokens, seq.cache, seq.num_computed, last_only=not is_scoring)
        seq.num_computed += len(chunk)
        self.metrics.prompt_tokens.inc(len(chunk))
        return logits

    def decode(self, seq: Sequence) -> torch.Tensor:
        """One token: the last sampled one goes in, the next one's logits come out."""
        tokens = torch.tensor(seq.output_ids[-1:], dtype=torch.int64)  # [1]
        logits = self.model.forward(tokens, seq.cache, seq.num_computed)
        seq.num_computed += 1
        return logits

    def postprocess(self, seq: Sequence, logits: torch.Tensor):
        if seq.params.is_prompt_logprobs and not seq.output_ids:  # this step was a prefill
            start = seq.num_computed - logits.shape[0]
            seq.events.put(PromptLogprobsEvent(sampler.prompt_logprobs(
                logits, seq.prompt_ids, start, seq.params.num_top_logprobs or 0)))
        if seq.is_prefilling:
            return
        if seq.params.max_tokens == 0:  # scoring only (echo + logprobs)
            seq.finish("length")
        else:
            self._append_sampled(seq, logits[-1])
        if seq.is_finished:
            self._observe_finished(seq)
            self.scheduler.finish(seq)
            self._release(seq)
            self._update_gauges()

    def _append_sampled(self, seq: Sequence, last_logits: torch.Tensor):
        token_id = sampler.sample(last_logits, seq.params, seq.generator)
        logprob = None
        if seq.params.num_top_logprobs is not None:
            logprob = sampler.token_logprob(last_logits, token_id, seq.params.num_top_logprobs)
        if seq.is_cancelled:
            self.metrics.tokens_after_cancel.inc()
        if seq.first_token_time is None:
            self.metrics.time_to_first_token.observe(time.monotonic() - seq.arrival_time)
        self.metrics.generated_tokens.inc()
        seq.append_token(token_id, logprob)

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
        helper.memcap_reserve(self._kv_bytes(seq))
        try:
            seq.cache = self.model.new_cache(seq.num_max_tokens)
        except Exception:
            helper.memcap_release(self._kv_bytes(seq))
            raise

    def _release(self, seq: Sequence):
        if seq.cache is not None:
            seq.cache = None
            helper.memcap_release(self._kv_bytes(seq))

    def _kv_bytes(self, seq: Sequence) -> int:
        # Recurrent models (Kimi-Linear's KDA) also hold a fixed state per sequence.
        fixed = int(getattr(self.model, "state_bytes", 0))
        return int(self.model.kv_bytes_per_token) * seq.num_max_tokens + fixed
