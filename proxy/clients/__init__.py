"""Who is calling: client detection (detect.py), the per-client presets (presets.py), and the
policy one request runs under (policy.py: the preset plus the config's overrides)."""
