"""Templates, tokenizers, output parsing."""
