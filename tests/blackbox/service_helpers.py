"""Run a daemon the way its systemd unit does, under a temporary root instead of /.

The unit's own ExecStart= and Environment= lines are used, with @BINDIR@ set to the venv's
bin and every /etc, /run and /var path moved under the root. The variables systemd sets
for the unit's directories (RUNTIME_DIRECTORY, STATE_DIRECTORY, CACHE_DIRECTORY,
LOGS_DIRECTORY) point at the same moved paths, and NOTIFY_SOCKET at a datagram socket
this module owns. Every wait has a deadline.
"""
import configparser
import http.client
import json
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import time

from tests.support.engine import Stoppable

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
SYSTEM_PATH = re.compile(r"(?<![\w@.-])/(etc|run|var)/")
DIRECTORIES = {"RuntimeDirectory": "/run", "StateDirectory": "/var/lib",
               "CacheDirectory": "/var/cache", "LogsDirectory": "/var/log"}


def unit_service(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string((ROOT / "systemd" / name).read_text())
    return parser["Service"]


class ServiceRoot:
    """A fake / for the packaged services: <root>/etc/kimi, <root>/run/kimi, <root>/var/..."""

    def __init__(self, root: pathlib.Path):
        self.root = root

    def moved(self, text: str) -> str:
        return SYSTEM_PATH.sub(lambda m: f"{self.root}/{m.group(1)}/", text)

    def path(self, system_path: str) -> pathlib.Path:
        return pathlib.Path(self.moved(system_path))

    def write_config(self, name: str, extra: str = "") -> pathlib.Path:
        """The shipped etc/<name> with its paths moved, plus `extra` lines, at /etc/kimi/<name>."""
        target = self.path(f"/etc/kimi/{name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.moved((ROOT / "etc" / name).read_text()) + extra)
        return target

    def command(self, unit: str) -> tuple[list[str], dict[str, str]]:
        """The unit's ExecStart argv and the environment systemd would give it."""
        service = unit_service(unit)
        argv = shlex.split(self.moved(service["ExecStart"].replace("@BINDIR@", str(BIN))))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KIMI_", "NOTIFY_"))}
        env["XDG_CACHE_HOME"] = str(self.root / "xdg-cache")
        env["XDG_STATE_HOME"] = str(self.root / "xdg-state")
        for assignment in shlex.split(service.get("Environment", "")):
            key, value = assignment.split("=", 1)
            env[key] = self.moved(value)
        env.update(self._environment_file(service.get("EnvironmentFile", "")))
        if env.get("KIMI_PROXY_ENGINE_USER") == "kimi":  # the engine's user: here, this one
            env["KIMI_PROXY_ENGINE_USER"] = str(os.getuid())
        for directive, base in DIRECTORIES.items():
            if directive in service:
                directory = self.path(f"{base}/{service[directive]}")
                directory.mkdir(parents=True, exist_ok=True)
                env[directive.replace("Directory", "_DIRECTORY").upper()] = str(directory)
        return argv, env


    def _environment_file(self, setting: str) -> dict[str, str]:
        """EnvironmentFile=[-]PATH: KEY=VALUE lines; "-" means a missing file is fine."""
        path = self.path(setting.removeprefix("-")) if setting else None
        if path is None or (setting.startswith("-") and not path.exists()):
            return {}
        lines = path.read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


class Notifications:
    """The datagram socket a Type=notify service reports to."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        path.unlink(missing_ok=True)  # a previous run's socket file
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.received: list[str] = []

    def next(self, timeout: float) -> str | None:
        self.sock.settimeout(timeout)
        try:
            message = self.sock.recv(4096).decode()
        except socket.timeout:
            return None
        self.received.append(message)
        return message

    def drain(self, timeout: float = 2.0) -> list[str]:
        """Everything received so far, after reading what is pending."""
        while self.next(timeout) is not None:
            pass
        return self.received

    def close(self):
        self.sock.close()


class Service(Stoppable):
    """One daemon started from its unit's ExecStart line."""

    def __init__(self, root: ServiceRoot, unit: str, health):
        self.root, self.unit, self.health = root, unit, health
        name = unit.removesuffix(".service")
        self.notify = Notifications(root.root / f"{name}.notify")
        self.argv, self.env = root.command(unit)
        self.env["NOTIFY_SOCKET"] = str(self.notify.path)
        self.stderr_path = root.root / f"{name}.stderr"
        self.proc: subprocess.Popen | None = None
        self.health_at_ready: int | None = None

    def start(self, timeout: float = 300) -> "Service":
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.DEVNULL,
                                         stderr=err)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float):
        """Until READY=1; at that moment, one /health probe (no retry) records its status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.unit} exited {self.proc.returncode}:\n{self.stderr()}")
            message = self.notify.next(timeout=1.0)
            if message and "READY=1" in message.split("\n"):
                self.health_at_ready = self.health()
                return
        raise TimeoutError(f"{self.unit}: no READY=1 after {timeout} s:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def _close(self):
        self.notify.close()


def http_health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_body(text: str, max_tokens: int, stream: bool = False) -> str:
    return json.dumps({"model": "kimi-local", "max_tokens": max_tokens, "stream": stream,
                       "temperature": 0, "messages": [{"role": "user", "content": text}]})
