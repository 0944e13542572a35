"""What kimi-engine and kimi-proxy both need from the system, written once: the two daemons
meet only over the socket, so neither imports the other, and both may import this."""
