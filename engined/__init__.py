"""kimi-engine: the engine daemon of kimi-local."""
__version__ = "0.1.0"
