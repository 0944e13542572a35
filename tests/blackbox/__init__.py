"""Real daemons as subprocesses on temporary sockets."""
