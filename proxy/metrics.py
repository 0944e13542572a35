"""Prometheus metrics in the app's own registry (never the process-global one)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kimi_proxy_requests", "Requests by route, preset and status",
                                ["route", "preset", "status"], registry=r)
        self.ttft = Histogram("kimi_proxy_ttft_seconds", "Time to the first upstream token",
                              ["route"], buckets=BUCKETS, registry=r)
        self.upstream_latency = Histogram("kimi_proxy_upstream_seconds", "Whole upstream request time",
                                          ["route"], buckets=BUCKETS, registry=r)
        self.parse_failures = Counter("kimi_proxy_tool_parse_failures", "Rejected tool calls in text",
                                      ["parser"], registry=r)
        self.dropped_tools = Counter("kimi_proxy_dropped_tools", "Hosted tools (web search, image "
                                     "generation, ...) the engine cannot run, left out of requests",
                                     ["dialect", "type"], registry=r)
        self.ledger = Counter("kimi_proxy_ledger_lookups", "Reasoning ledger lookups", ["result"],
                              registry=r)
        self.stream_errors = Counter("kimi_proxy_stream_errors", "Streams ended by an error",
                                     ["route"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
