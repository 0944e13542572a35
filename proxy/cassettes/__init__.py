"""Cassettes (protocols.md §10): `--record` writes them (record.py), `kimi-proxy replay` re-runs
them through the translation and diffs the result (replay.py), with explained differences
read from an allowlist (allowlist.py)."""
