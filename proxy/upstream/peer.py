"""Who serves the engine socket: the proxy speaks only to an engine of its own user, of root,
or of the engine-user config key (the packaged units run the engine as kimi, the proxy as
kimi-proxy).

Another local user who got the socket path first (the /tmp/kimi-$UID fallback) could serve a
fake engine and feed tool calls to the user's agents, which run them. The kernel tells who
listens (SO_PEERCRED: the listener's credentials at listen()); checked once per connection,
logged once per listening process (a refused engine is asked again for every request).
Root is trusted: it can read and change this process anyway, so refusing it protects nothing.
"""
from __future__ import annotations

import logging
import os
import socket
import struct

from proxy.errors import UpstreamError

log = logging.getLogger("kimi.proxy")
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_logged: set[tuple[str, int, int]] = set()  # (path, uid, pid) already in the log


class UntrustedUpstream(UpstreamError):
    """The engine socket is served by another user's process: 502, and never spoken to."""


def trusted_uids(engine_uid: int | None = None) -> tuple[int, ...]:
    own = (os.geteuid(), 0)
    return own if engine_uid is None or engine_uid in own else own + (engine_uid,)


def check_peer(sock: socket.socket, path: str, engine_uid: int | None = None) -> None:
    """Raise UntrustedUpstream (and log one line) when the process listening behind the
    connected Unix socket `sock` runs as a user we do not trust."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, _gid = _UCRED.unpack(raw)
    trusted = trusted_uids(engine_uid)
    if uid in trusted:
        return
    if (path, uid, pid) not in _logged:
        _logged.add((path, uid, pid))
        log.warning("refusing the engine socket %s: it is served by uid %d (pid %d), not by uid %s; "
                    "check who made its directory, or set engine-user to the engine's user",
                    path, uid, pid, " or ".join(map(str, trusted)))
    raise UntrustedUpstream(f"the engine socket {path} is served by another user (uid {uid}), "
                            "not by kimi-engine of this proxy's user or engine-user; refusing to use it")
