"""Building blocks of the torch forward: one small file per layer; each layer owns its weights."""
