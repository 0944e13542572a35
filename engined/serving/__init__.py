"""The daemon's life and its HTTP face: listen, the server, routes, request parsing, bodies, logs."""
