"""Weights on disk: GGUF repack, the INT4 artifact and manifest, Kimi checkpoints, loading, quantizing."""
