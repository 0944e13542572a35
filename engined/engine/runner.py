"""The decode runner: the engine hands it a batch, and it owns the decode step.

Eager everywhere: the model's `decode_batch` (one token for each of B sequences). On CUDA,
unless `--enforce-eager`, `capture()` records the step once per bucket (1, 2, 4, 8, 16,
up to the first bucket that holds `--max-batch`) in a CUDA graph, after a warm-up (kernel
compilation, MLA's absorbed weights); a batch then runs padded up to its bucket by one
replay, every per-step value living in the bucket's static device tensors (the model's
graph step: token ids, positions, state slots, block tables; a padded row reads and writes
only scratch: models/kimi_graph_step.py). A step is one or more GPU segments: a model with
routed experts in RAM has a segment before each offloaded MoE layer's CPU part and one after
the last (models/kimi_piecewise.py), each captured in its own graph, all of a bucket in one
memory pool, replayed in order with the CPU experts between the replays.
A model without a capturable step (`graph_step` returns None: Llama, which serves the CPU)
and a bucket whose capture fails run eagerly; failures are logged and counted, never fatal.
The anchor is nano-vllm's ModelRunner.capture_cudagraph.
"""
import time
from types import SimpleNamespace

import torch

from engined.models.protocol import StaleGraphs

BUCKETS = (1, 2, 4, 8, 16)


class _Uncounted:
    """A counter that counts nothing: the metrics of a runner outside the engine (the
    synthetic bench runs on the GPU image, without prometheus_client)."""

    def labels(self, *values):
        return self

    def inc(self, amount: float = 1):
        pass


def buckets_for(max_batch: int) -> tuple[int, ...]:
    """The buckets up to the first that holds max_batch rows (all of them beyond 16)."""
    wanted = [b for b in BUCKETS if b < max_batch] + [next((b for b in BUCKETS if b >= max_batch), BUCKETS[-1])]
    return tuple(sorted(set(wanted)))


class Runner:
    def __init__(self, model, metrics, log=print, max_batch: int = 8, max_context: int = 8192,
                 enforce_eager: bool = False):
        uncounted = SimpleNamespace(decode_steps=_Uncounted(), graph_capture_failures=_Uncounted())
        self.model, self.metrics, self.log = model, metrics or uncounted, log
        self.max_batch, self.max_context, self.enforce_eager = max_batch, max_context, enforce_eager
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, object]] = {}

    @property
    def device(self) -> torch.device:
        return torch.device(self.model.device)

    def capture(self, warmup: int = 2):
        """At start-up: a graph per bucket on CUDA (nothing on the CPU or with enforce_eager),
        the largest bucket first, since building its step reserves the pools for all."""
        if self.device.type != "cuda" or self.enforce_eager:
            why = "--enforce-eager" if self.enforce_eager else f"device {self.device.type}"
            self.log(f"kimi-engine: decode runs eagerly ({why})")
            return
        for bucket in reversed(buckets_for(self.max_batch)):  # largest first: it sizes the pools
            step = self.model.graph_step(bucket, self.max_context)
            if step is None:
                self.log("kimi-engine: this model has no capturable decode step; decode runs eagerly")
                return
            started, free_before = time.monotonic(), torch.cuda.mem_get_info()[0]
            try:
                self.graphs[bucket] = (_capture(step, warmup), step)
            except Exception as exc:  # noqa: BLE001 - a failed bucket falls back to eager
                self.metrics.graph_capture_failures.inc()
                self.log(f"kimi-engine: CUDA graph capture failed for {bucket} rows, that bucket "
                         f"runs eagerly: {exc!r}")
                continue
            used = (free_before - torch.cuda.mem_get_info()[0]) / 2**20
            pieces = f", {len(step.segments)} segments around the CPU experts" if step.crossings else ""
            self.log(f"kimi-engine: captured the decode step for {bucket} rows in "
                     f"{time.monotonic() - started:.2f} s, {used:.0f} MiB{pieces}")

    def decode(self, tokens: list[int], caches: list, positions: list[int]) -> torch.Tensor:
        """One token for each of B sequences -> logits fp32 [B, V] on the model's device."""
        rows = len(tokens)
        bucket = next((b for b in sorted(self.graphs) if b >= rows), None)
        if bucket is None:
            self.metrics.decode_steps.labels("eager", str(rows)).inc()
            ids = torch.tensor(tokens, dtype=torch.int64, device=self.model.device)  # [B]
            return self.model.decode_batch(ids, caches, positions)
        graph, step = self.graphs[bucket]
        try:
            step.load(tokens, caches, positions)   # per-step values into the static tensors, padded
        except StaleGraphs as exc:  # a pool moved: every graph reads stale addresses
            self.log(f"kimi-engine: decode graphs dropped, decoding eagerly from now on: {exc!r}")
            self.graphs.clear()
            return self.decode(tokens, caches, positions)
        graph.replay()
        step.finish(caches, positions)
        self.metrics.decode_steps.labels("graph", str(bucket)).inc()
        return step.logits[:rows]


class _Pieces:
    """A captured step: replay() runs its graphs in order, the CPU parts between them."""

    def __init__(self, step, replays: dict):
        self.step, self.replays = step, replays

    def replay(self):
        self.step.run(self.replays)


def _capture(step, warmup: int) -> _Pieces:
    """Warm up, then record each GPU piece of step.run() (on scratch rows) in a graph of its
    own, in the order a step runs them, all in one memory pool: a piece's outputs are the
    step's attributes the next piece reads, at the same addresses."""
    step.load_scratch()
    _warm_up(step, warmup)
    pool = torch.cuda.graph_pool_handle()
    return _Pieces(step, {piece: _record(piece, pool) for piece in step.pieces()})


def _warm_up(step, warmup: int):
    """Run the step eagerly on a side stream (kernel compilation, lazy buffers)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step.run()
    torch.cuda.current_stream().wait_stream(side)


def _record(piece, pool):
    """piece() captured in a CUDA graph in `pool` -> the graph's replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        piece()
    return graph.replay
