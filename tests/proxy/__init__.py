"""kimi-proxy in process."""
