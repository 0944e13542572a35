"""sd_notify without a dependency: one datagram to $NOTIFY_SOCKET (no-op when unset), for
systemd's Type=notify units of both daemons."""
import os
import socket


def sd_notify(state: str, env=os.environ) -> bool:
    """Send e.g. "READY=1"; returns whether a notification socket was there to send to."""
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False
