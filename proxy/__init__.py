"""kimi-proxy: the protocol proxy of kimi-local."""
__version__ = "0.1.0"
