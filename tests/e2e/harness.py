"""Run one real agent CLI through ../shared/tools/agent-clients/run_client.sh, and read back
what the servers behind it saw: the fake upstream's log, the proxy's cassettes, the engine's
request lines.
"""
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = ROOT.parent / "shared" / "tools" / "agent-clients" / "run_client.sh"
CLIENTS_DIR = pathlib.Path(os.environ.get("CLIENTS_DIR", "/tmp/kimi-agent-clients"))
BIN = pathlib.Path(sys.executable).parent
PROXY_PORT = 18080
UPSTREAM_PORT = 9100


@dataclasses.dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    server_log: str

    def context(self) -> str:
        """The tail of everything a failed assertion needs to be read."""
        return (f"exit {self.returncode}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n"
                f"{self.stderr[-3000:]}\nserver log:\n{self.server_log[-3000:]}")


def run_client(client: str, prompt: str, server_cmd: str, tmp_path: pathlib.Path,
               scenario: str = "text", timeout_s: int = 150, wait_s: int = 60, **env) -> Run:
    env = dict(os.environ, SERVER_CMD=server_cmd, CLIENTS_DIR=str(CLIENTS_DIR),
               TIMEOUT=str(timeout_s), WAIT_S=str(wait_s),
               CAPTURE=str(tmp_path / "capture.jsonl"), **env)
    result = subprocess.run(["bash", str(RUNNER), client, str(PROXY_PORT), prompt, scenario],
                            env=env, capture_output=True, text=True,
                            timeout=timeout_s + wait_s + 120)
    log = CLIENTS_DIR / "logs" / f"server-{client}-{scenario}.log"
    return Run(result.returncode, result.stdout, result.stderr,
               log.read_text(errors="replace") if log.exists() else "")


def fake_upstream_cmd(tmp_path: pathlib.Path, scenario: str, *upstream_args: str) -> str:
    """kimi-proxy in front of tests/e2e/fake_upstream.py, both started inside the namespace."""
    return (f"{BIN}/python {ROOT}/tests/e2e/fake_upstream.py --port {UPSTREAM_PORT} "
            f"--scenario {scenario} --log {tmp_path}/upstream.jsonl {' '.join(upstream_args)} "
            f"& exec {BIN}/kimi-proxy serve "
            f"--port {PROXY_PORT} --upstream http://127.0.0.1:{UPSTREAM_PORT}/v1 "
            f"--ledger {tmp_path}/ledger.sqlite")


@dataclasses.dataclass
class ProxyRun:
    """Where the kimi-proxy that a client run starts leaves its traces: its log and cassettes."""
    tmp_path: pathlib.Path

    def __post_init__(self):
        self.proxy_log = self.tmp_path / "proxy.log"
        self.cassettes = self.tmp_path / "cassettes"

    def proxy_cmd(self, upstream: str, port: int = PROXY_PORT) -> str:
        return (f"exec {BIN}/kimi-proxy serve --port {port} --upstream {upstream} "
                f"--ledger {self.tmp_path}/ledger.sqlite --log-file {self.proxy_log} "
                f"--record {self.cassettes}")

    def recorded(self) -> list[dict]:
        """The proxy's cassettes, oldest first."""
        paths = sorted(self.cassettes.glob("*.json")) if self.cassettes.exists() else []
        return sorted((json.loads(p.read_text()) for p in paths), key=lambda c: c["recorded_at"])

    def trace_files(self) -> tuple[pathlib.Path, ...]:
        return (self.proxy_log,)

    def logs(self) -> str:
        return "\n".join(f"{p.name}:\n{p.read_text(errors='replace')[-3000:]}"
                         for p in self.trace_files() if p.exists())


@dataclasses.dataclass
class EngineRun(ProxyRun):
    """kimi-engine (default model) and the kimi-proxy in front of it, both inside the namespace."""
    cache: pathlib.Path = CLIENTS_DIR / "kimi-cache"  # the default model's repack, kept between runs

    def __post_init__(self):
        super().__post_init__()
        # a short directory: a Unix socket path must fit in 108 bytes
        self.socket = pathlib.Path(tempfile.mkdtemp(prefix="kimi-e2e-")) / "engine.sock"
        self.engine_log = self.tmp_path / "engine.log"

    def server_cmd(self, port: int = PROXY_PORT) -> str:
        """The engine first; the proxy once the engine's socket exists (or the engine died, so
        that the client fails at once), so that the port the client waits for opens when the
        whole chain can answer."""
        return (f"XDG_CACHE_HOME={self.cache} {BIN}/kimi-engine serve --model default "
                f"--socket {self.socket} --log-file {self.engine_log} & E=$!; "
                f"for i in $(seq 3000); do [ -S {self.socket} ] || ! kill -0 $E 2>/dev/null "
                f"&& break; sleep 0.1; done; " + self.proxy_cmd(f"unix://{self.socket}", port))

    def engine_requests(self) -> list[dict]:
        """The engine's request lines (one per request) as dicts of their key=value fields."""
        lines = self.engine_log.read_text().splitlines() if self.engine_log.exists() else []
        return [{k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', line)}
                for line in lines if "request_id=" in line]

    def trace_files(self) -> tuple[pathlib.Path, ...]:
        return (self.engine_log, self.proxy_log)


def upstream_text(cassette: dict) -> str:
    """The text the upstream (the engine) returned for one recorded request."""
    upstream = cassette["upstream"]
    if upstream["response"]:
        return "".join(ch["message"].get("content") or "" for ch in upstream["response"]["choices"])
    return "".join(ch.get("delta", {}).get("content") or ""
                   for chunk in upstream["chunks"] for ch in chunk.get("choices", []))


def printed_text(stdout: str) -> str:
    """stdout plus every string inside the JSON lines in it: clients that print JSON events
    (codex, claude, opencode, cline) escape newlines and quotes in the answer."""
    strings = [stdout]

    def walk(value):
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for line in stdout.splitlines():
        if line.lstrip().startswith(("{", "[")):
            try:
                walk(json.loads(line))
            except ValueError:
                pass
    return "\n".join(strings)


def normalised(text: str) -> str:
    """Words only, lower case, one space between them: clients reflow and restyle markdown."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


MIN_WORDS = 2          # an answer shorter than this proves nothing
COMPARED_WORDS = 30    # clients may cut a long answer short; the first words must be there


def check_printed_answer(run: Run, trace: ProxyRun, context: str) -> None:
    """The client printed the first words of what the upstream answered to its agent turn: the
    largest request the proxy recorded (opencode first asks for a session title)."""
    recorded = [c for c in trace.recorded() if c["upstream"]["request"]]
    assert recorded, f"the proxy recorded no request\n{context}"
    turn = max(recorded, key=lambda c: len(str(c["upstream"]["request"])))
    words = normalised(upstream_text(turn)).split()
    assert len(words) >= MIN_WORDS, f"the upstream answered {upstream_text(turn)!r}\n{context}"
    assert " ".join(words[:COMPARED_WORDS]) in normalised(printed_text(run.stdout)), context
