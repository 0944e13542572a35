"""At most max_connections connections have a thread (a mixin for ThreadingMixIn servers).

A slot is taken in the accepting thread and freed when the connection's thread ends. At the
cap, `is_pressed` tells idle kept-alive connections to close and make room; a connection
that still finds no slot within ROOM_WAIT_S is answered 503 (too_many_connections, with
Retry-After) and closed, so a client learns why instead of waiting unanswered.
"""
import http
import json
import socket
import threading

from engined.errors import EngineError, TooManyConnections

ROOM_WAIT_S = 1.0


class ConnectionCap:
    is_pressed = False  # a new connection waits for a slot: idle ones close

    def cap_connections(self, max_connections: int):
        self.slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.is_pressed = True
            has_slot = self.slots.acquire(timeout=ROOM_WAIT_S)
            self.is_pressed = False
            if not has_slot:
                refuse(request, TooManyConnections("the engine has all its connections open "
                                                   "and none is idle; retry shortly"))
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def refuse(sock: socket.socket, err: EngineError):
    """The whole answer in one small write, from the accepting thread, which must not block;
    then what the client already sent is read, since unread input at close resets the answer."""
    body = json.dumps(err.body()).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in err.headers().items())
    head = (f"HTTP/1.1 {err.status} {http.HTTPStatus(err.status).phrase}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n")
    try:
        sock.settimeout(0.5)
        sock.sendall(head.encode() + body)
        for _ in range(16):  # at most 1 MiB
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                break
    except OSError:  # BlockingIOError: nothing more has arrived
        pass
