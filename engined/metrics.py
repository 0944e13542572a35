"""Prometheus metrics of one engine, in its own registry (nothing global, nothing at import)."""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engined.engine import memory

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_GRAMMAR_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class EngineMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.time_to_first_token = Histogram(
            "kimi_engine_time_to_first_token_seconds",
            "Arrival of a request to its first generated token", buckets=_LATENCY_BUCKETS,
            registry=r)
        self.decode_rate = Histogram(
            "kimi_engine_decode_tokens_per_second",
            "Decode speed of each finished request (tokens after the first / seconds)",
            buckets=_RATE_BUCKETS, registry=r)
        self.queue_depth = Gauge("kimi_engine_queue_depth",
                                 "Requests waiting for KV cache room", registry=r)
        self.running = Gauge("kimi_engine_running_requests",
                             "Requests being prefilled or decoded", registry=r)
        self.load_time = Gauge("kimi_engine_load_time_seconds",
                               "Seconds spent loading the model at start", registry=r)
        self.requests = Counter("kimi_engine_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("kimi_engine_prompt_tokens",
                                     "Prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter("kimi_engine_generated_tokens",
                                        "Tokens generated", registry=r)
        self.cancelled = Counter("kimi_engine_cancelled_requests",
                                 "Requests cancelled because their client went away", registry=r)
        Gauge("kimi_engine_resident_bytes", "Resident set size of the engine process",
              registry=r).set_function(memory.current_rss)
        Gauge("kimi_engine_memory_reserved_bytes",
              "Bytes reserved against the memory cap: weights + running sequences' KV",
              registry=r).set_function(memory.reserved)
        self.tokens_after_cancel = Counter(
            "kimi_engine_tokens_after_cancel",
            "Tokens generated for a request after its client went away (stays near 0 when "
            "cancellation stops the loop)", registry=r)

        self._add_prefix_cache_metrics(r)
        self._add_batching_metrics(r)
        self._add_grammar_metrics(r)
        self._add_speculation_metrics(r)

    def _add_prefix_cache_metrics(self, r: CollectorRegistry):
        self.prefix_hit_tokens = Counter(
            "kimi_engine_prefix_cache_hit_tokens",
            "Prompt tokens restored from the prefix cache instead of prefilled", registry=r)
        self.prefix_miss_tokens = Counter(
            "kimi_engine_prefix_cache_miss_tokens",
            "Prompt tokens prefilled because no cached prefix covered them", registry=r)
        self.prefix_evictions = Counter(
            "kimi_engine_prefix_cache_evictions",
            "Prefix cache entries evicted (least recently used first)", registry=r)
        self.prefix_cache_bytes = Gauge(
            "kimi_engine_prefix_cache_bytes",
            "Bytes held by the prefix cache (reserved against the memory cap)", registry=r)

    def _add_speculation_metrics(self, r: CollectorRegistry):
        self.spec_draft_tokens = Counter(
            "kimi_engine_spec_draft_tokens",
            "Tokens drafted by prompt lookup and verified in a decode step", registry=r)
        self.spec_accepted_tokens = Counter(
            "kimi_engine_spec_accepted_tokens",
            "Drafted tokens that stood (each saves a decode step)", registry=r)

    def _add_batching_metrics(self, r: CollectorRegistry):
        self.steps = Counter("kimi_engine_steps", "Model steps by kind (prefill chunk or "
                             "batched decode)", ["kind"], registry=r)
        self.decode_batch_size = Histogram(
            "kimi_engine_decode_batch_size", "Sequences decoded together in one step",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=r)
        self.decode_steps = Counter(
            "kimi_engine_decode_steps", "Decode steps by how they ran: a CUDA graph replay of "
            "a bucket (rows padded up to it), or eager (bucket = the rows)", ["mode", "bucket"],
            registry=r)
        self.graph_capture_failures = Counter(
            "kimi_engine_graph_capture_failures",
            "Decode buckets whose CUDA graph capture failed at start (they run eagerly)",
            registry=r)

    def _add_grammar_metrics(self, r: CollectorRegistry):
        self.grammar_compile = Histogram(
            "kimi_engine_grammar_compile_seconds", "Compile time of a grammar not yet cached "
            "(JSON schema, regex, Lark, tool calls)", buckets=_GRAMMAR_BUCKETS, registry=r)
        self.grammar_mask = Histogram(
            "kimi_engine_grammar_mask_seconds", "Compute time of one token mask (on the "
            "grammar thread, during the forward)", buckets=_GRAMMAR_BUCKETS, registry=r)
        self.grammar_masks = Counter(
            "kimi_engine_grammar_masks", "Token masks applied, by whether the mask was ready "
            "before the logits", ["ready"], registry=r)

    def observe_grammar_mask(self, ms: float, is_ready: bool):
        self.grammar_mask.observe(ms / 1e3)
        self.grammar_masks.labels("yes" if is_ready else "no").inc()

    def watch_offload(self, counters):
        """Export a model's layers/moe_offload.OffloadCounters (routed experts in RAM): the
        model thread counts in plain ints, read here at scrape time."""
        self.registry.register(_OffloadCollector(counters))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _OffloadCollector:
    def __init__(self, counters):
        self.counters = counters

    def collect(self):
        calls = CounterMetricFamily(
            "kimi_engine_offload_moe_calls", "MoE layer calls whose routed experts ran on the "
            "CPU threads from RAM (the hybrid step)")
        calls.add_metric([], self.counters.moe_calls)
        moved = CounterMetricFamily(
            "kimi_engine_offload_bytes", "Bytes through the host buffers of the hybrid MoE "
            "step: hidden rows and routing to the host, routed outputs back", labels=["direction"])
        moved.add_metric(["to_host"], self.counters.bytes_to_host)
        moved.add_metric(["to_device"], self.counters.bytes_to_device)
        cache = self.counters.cache
        if cache is None:
            return [calls, moved]
        return [calls, moved, *_cache_families(cache)]


def _cache_families(cache) -> list:
    """The GPU expert cache (layers/expert_cache.CacheCounters): lookups per offloaded
    layer by result, and the uploads from RAM."""
    lookups = CounterMetricFamily(
        "kimi_engine_moe_cache_lookups", "Chosen experts of the MoE layers in RAM looked up "
        "in the GPU expert cache, by layer and result (hit: ran on the GPU)",
        labels=["layer", "result"])
    for layer in sorted(cache.hits):
        lookups.add_metric([str(layer), "hit"], cache.hits[layer])
        lookups.add_metric([str(layer), "miss"], cache.misses.get(layer, 0))
    uploads = CounterMetricFamily(
        "kimi_engine_moe_cache_uploads", "Experts uploaded from RAM into the GPU expert cache "
        "(on a side stream)")
    uploads.add_metric([], cache.uploads)
    moved = CounterMetricFamily(
        "kimi_engine_moe_cache_upload_bytes", "Bytes uploaded into the GPU expert cache")
    moved.add_metric([], cache.upload_bytes)
    return [lookups, uploads, moved]
