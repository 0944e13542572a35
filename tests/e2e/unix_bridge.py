"""A Unix socket that forwards each connection to a TCP port on this host's loopback.

run_client.sh runs a client and its SERVER_CMD in a network namespace that has a loopback of its
own, so a server started outside (vLLM: a minute to start) cannot be reached there over TCP. A
Unix socket lives in the file system, which the namespace shares: kimi-proxy inside serves
`--upstream unix://PATH`, and this bridge outside carries the bytes, unchanged, to the server.
"""
from __future__ import annotations

import pathlib
import socket
import socketserver
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copies src to dst until src's end, then ends dst's writing half."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class UnixBridge:
    """with UnixBridge(path, port): connections to `path` reach 127.0.0.1:port."""

    def __init__(self, path: pathlib.Path, port: int):
        self.path = path
        target = ("127.0.0.1", port)

        class Forward(socketserver.BaseRequestHandler):
            def handle(self):
                with socket.create_connection(target) as upstream:
                    back = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
                    back.start()
                    _pump(self.request, upstream)
                    back.join()

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(str(path), Forward)

    def __enter__(self) -> "UnixBridge":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)
