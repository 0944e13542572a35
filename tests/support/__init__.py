"""Helpers shared across test folders: engine clients and daemons, the tiny Kimi checkpoint, proxy fakes."""
