"""Model architectures: each file only wires engined/layers together."""
