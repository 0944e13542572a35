"""The proxy and the engine meet only over the socket: the proxy imports nothing from engined.

The two rules both daemons need, the default socket path and sd_notify, exist once on each
side; these tests pin the proxy's copy equal to the engine's (tests may import engined).
"""
import ast
import pathlib
import socket

import pytest

from engined.config import default_socket_path as engine_socket_path
from engined.serving.notify import sd_notify as engine_sd_notify
from proxy.config import default_socket_path as proxy_socket_path
from proxy.server import sd_notify as proxy_sd_notify

PROXY = pathlib.Path(__file__).resolve().parents[2] / "proxy"


@pytest.mark.parametrize("env", [
    {},
    {"XDG_RUNTIME_DIR": "/run/user/1000"},
    {"RUNTIME_DIRECTORY": "/run/kimi"},
    {"RUNTIME_DIRECTORY": "/run/kimi:/run/other", "XDG_RUNTIME_DIR": "/run/user/1000"},
    {"RUNTIME_DIRECTORY": "", "XDG_RUNTIME_DIR": ""},
])
def test_socket_path_rule_is_the_engines(env):
    assert proxy_socket_path(env) == str(engine_socket_path(env))


def _received(notify, env: dict, sock_path: pathlib.Path) -> tuple[bool, bytes | None]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(sock_path))
        server.settimeout(2)
        sent = notify("READY=1", {k: v.format(sock=sock_path) for k, v in env.items()})
        try:
            data = server.recv(256) if sent else None
        except socket.timeout:
            data = None
    sock_path.unlink()
    return sent, data


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "{sock}"},
                                 {"NOTIFY_SOCKET": "{sock}.missing"}])
def test_sd_notify_is_the_engines(env, tmp_path):
    proxy = _received(proxy_sd_notify, env, tmp_path / "p.sock")
    engine = _received(engine_sd_notify, env, tmp_path / "e.sock")
    assert proxy == engine
    assert proxy == ((True, b"READY=1") if env.get("NOTIFY_SOCKET") == "{sock}" else (False, None))


def test_no_proxy_module_imports_engined():
    offenders = []
    for path in sorted(PROXY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(PROXY.parent)}: {n}" for n in names
                          if n == "engined" or n.startswith("engined.")]
    assert offenders == []
