"""Model wiring against independent references."""
