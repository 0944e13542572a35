"""Subcommands beyond serve: doctor, Kimi quantize/verify, the synthetic bench."""
