"""GGUF repack, checkpoints, quantize, loading."""
