"""The listening Unix socket: refuse a live one, replace a stale one, appear atomically.

The new socket is bound at a temporary name beside the target, given mode 0660, listening,
and then renamed over the target, so a client never sees a half-made socket.
"""
import errno
import os
import pathlib
import socket
import stat

from engined.config import ensure_socket_dir

_MAX_PATH = 108  # sun_path, including the terminating NUL


class SocketInUse(RuntimeError):
    """Another server answers on the socket path, or the path is not a socket."""


def check_socket_path(path: pathlib.Path):
    """Raise SocketInUse when a live server listens at `path` or it is some other file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return  # stale: nobody listens; bind_socket replaces it
            raise SocketInUse(f"{path}: cannot tell whether it is in use ({exc})") from None
    raise SocketInUse(f"another server is already listening on {path}; stop it first "
                      "or choose another --socket")


class Listener:
    """The bound, listening socket and the inode of its file (to unlink only our own)."""

    def __init__(self, path: pathlib.Path, backlog: int = 128):
        self.path = path
        self.sock = _bind(path, backlog)
        self.inode = os.stat(path).st_ino

    def remove(self):
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except OSError:
            pass


def _bind(path: pathlib.Path, backlog: int) -> socket.socket:
    ensure_socket_dir(path)
    check_socket_path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if len(os.fsencode(temporary)) >= _MAX_PATH:  # no room for a temporary name: bind in place
        with _suppress_missing():
            os.unlink(path)
        temporary = path
    with _suppress_missing():
        os.unlink(temporary)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(temporary))
        os.chmod(temporary, 0o660)
        sock.listen(backlog)
        if temporary != path:
            os.rename(temporary, path)
    except OSError:
        sock.close()
        with _suppress_missing():
            os.unlink(temporary)
        raise
    return sock


class _suppress_missing:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, FileNotFoundError)
