"""The proxy and the engine meet only over the socket: the proxy imports nothing from engined.

sd_notify, which both daemons need, is written once in kimi_common, which imports neither of
them. The default socket path exists once on each side; these tests pin the proxy's copy equal
to the engine's (tests may import engined).
"""
import ast
import pathlib
import socket

import pytest

from engined.config import default_socket_path as engine_socket_path
from engined.serving import daemon
from kimi_common.notify import sd_notify
from proxy import server
from proxy.config import default_socket_path as proxy_socket_path

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
def test_sd_notify(env, tmp_path):
    sent = _received(sd_notify, env, tmp_path / "n.sock")
    assert sent == ((True, b"READY=1") if env.get("NOTIFY_SOCKET") == "{sock}" else (False, None))


def test_both_daemons_notify_through_kimi_common():
    assert server.sd_notify is daemon.sd_notify is sd_notify


def imports_of(package: str, *, banned: tuple[str, ...]) -> list[str]:
    """`path: module` for each import in ROOT/package of a module under one of `banned`."""
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] in banned]
    return offenders


def test_no_proxy_module_imports_engined():
    assert imports_of("proxy", banned=("engined",)) == []


def test_kimi_common_imports_neither_daemon():
    assert imports_of("kimi_common", banned=("engined", "proxy")) == []
