"""Prometheus metrics in the app's own registry (never the process-global one)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# The hosted tool types the vendors document: the label set of kimi_proxy_dropped_tools. A
# client names the type, so any other string counts as "other": labels stay few and clean.
HOSTED_TOOL_TYPES = frozenset({
    # Anthropic server and client tools
    "web_search_20250305", "web_fetch_20250910", "code_execution_20250522",
    "code_execution_20250825", "computer_20241022", "computer_20250124",
    "text_editor_20241022", "text_editor_20250124", "text_editor_20250429",
    "text_editor_20250728", "bash_20241022", "bash_20250124", "memory_20250818",
    "tool_search_tool_regex_20251119", "tool_search_tool_bm25_20251119", "mcp_toolset",
    # OpenAI Responses hosted tools
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "code_interpreter", "image_generation", "computer_use_preview", "mcp",
    "local_shell", "shell", "apply_patch",
})


def tool_type_label(kind: str) -> str:
    return kind if kind in HOSTED_TOOL_TYPES else "other"


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
