"""The engine side: the Chat Completions payload built from a canonical request (payload.py),
and the client that sends it over a Unix socket or HTTP(S) (client.py, on http11.py)."""
