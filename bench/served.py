"""The engine as a bench script's subprocess: `python -m engined serve` (not the kimi-engine
launcher, which the GPU image lacks) on a temporary socket, its metrics, and its peak memory.

The engine runs in its own process group (a new session), and `stop` ends that whole group.
Its log goes where the caller says (gpu_run.sh: under $OUT, so it comes back with the
results); where KIMI_BENCH_PIDS names a folder, the group's id is written there while it
runs, so gpu_run.sh can end an engine whose bench script was killed before it could.
`on_sigterm()` turns SIGTERM (a section's `timeout`) into SystemExit, so the bench's
`finally` stops its engine.

Peak memory, best source first: the engine's own DEVICE_PEAK metric, when a build exposes it
(torch.cuda.max_memory_reserved is not reachable from outside the process); on CUDA,
nvidia-smi's used memory of the engine's process (its CUDA context included), sampled every
0.5 s, or of the whole GPU where nvidia-smi has no per-process rows (a sandboxed runtime); on
the CPU, the engine's VmHWM. Each result says which source it came from.
"""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import unix_metrics  # noqa: E402

DEVICE_PEAK = "kimi_engine_device_memory_peak_bytes"
PIDS_ENV = "KIMI_BENCH_PIDS"  # a folder: each running engine's process group id, a file


def on_sigterm():
    """SIGTERM (a section's time limit) -> SystemExit(143): `finally` blocks stop engines."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class Engine:
    """`python -m engined serve` on a temporary socket, in its own process group; its log at
    `log` (default: beside the socket, deleted on stop). extra_args: more serve flags, e.g.
    ("--cpu-moe",) or ("--gpu-memory", "24GiB")."""

    def __init__(self, model: str, device: str, max_context: int, max_batch: int,
                 threads: int | None = None, start_timeout: float = 300,
                 extra_args: tuple[str, ...] = (), log: pathlib.Path | None = None):
        self.device = device
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="kimi-serve-"))
        self.sock, self.log = str(self.dir / "engine.sock"), log or self.dir / "engine.log"
        command = [sys.executable, "-m", "engined", "serve", "--model", model, "--device", device,
                   "--socket", self.sock, "--max-context", str(max_context),
                   "--max-batch", str(max_batch), *extra_args] + (
                       ["--threads", str(threads)] if threads else [])
        env = dict(os.environ, XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(self.dir)))
        with self.log.open("w") as log_file:
            self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                         stderr=log_file, start_new_session=True)
        self.pidfile = self._write_pidfile()
        try:
            self._wait_for_socket(command, start_timeout)
        except BaseException:  # SIGTERM while it starts included: no engine outlives its bench
            self.stop()
            raise

    def _write_pidfile(self) -> pathlib.Path | None:
        folder = os.environ.get(PIDS_ENV)
        if not folder:
            return None
        path = pathlib.Path(folder) / str(self.proc.pid)  # the group id: the engine leads it
        path.write_text(f"{self.proc.pid}\n")
        return path

    def _wait_for_socket(self, command: list[str], start_timeout: float):
        deadline = time.time() + start_timeout
        while not os.path.exists(self.sock):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{' '.join(command)} did not start:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> dict[str, float]:
        """GET /metrics -> sample name (labels included) -> value."""
        return unix_metrics(self.sock)

    def peak_rss(self) -> int:
        status = pathlib.Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) * 1024

    def stop(self, timeout: float = 10):
        """SIGTERM to the engine's process group, then SIGKILL to whatever of the group is
        left after `timeout` seconds (the engine's own children included)."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, None)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:  # nothing left in the group
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        if self.pidfile:
            self.pidfile.unlink(missing_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class GpuMemorySampler(threading.Thread):
    """Peak of nvidia-smi's used memory: the engine process's row, and the whole GPU's."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.process_peak, self.gpu_peak = str(pid), 0, 0
        self.is_done = threading.Event()

    @classmethod
    def start_for(cls, engine: Engine) -> "GpuMemorySampler | None":
        if not shutil.which("nvidia-smi"):
            return None
        sampler = cls(engine.proc.pid)
        sampler.sample_once()  # now: the peak at start is read right after start_for
        sampler.start()
        return sampler

    def query(self, what: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                             check=False, capture_output=True, text=True, timeout=10).stdout
        return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line]

    def sample(self):
        apps, gpu = self.query("compute-apps=pid,used_memory"), self.query("gpu=memory.used")
        mib = [int(row[1]) for row in apps if row[0] == self.pid]
        self.process_peak = max([self.process_peak] + [m << 20 for m in mib])
        self.gpu_peak = max(self.gpu_peak, int(gpu[0][0]) << 20 if gpu else 0)

    def sample_once(self):
        try:
            self.sample()
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            print(f"nvidia-smi sample skipped: {exc!r}", file=sys.stderr)

    def run(self):
        while not self.is_done.wait(0.5):
            self.sample_once()

    def result(self) -> dict:
        """The peak so far, and the sampling stops."""
        self.is_done.set()
        if self.is_alive():
            self.join()
        return self.peak()

    def peak(self) -> dict:
        """The peak so far; sampling goes on."""
        if self.process_peak:
            return {"bytes": self.process_peak, "source": "nvidia-smi, the engine process's used "
                    "memory (CUDA context included), sampled every 0.5 s"}
        return {"bytes": self.gpu_peak, "source": "nvidia-smi, the whole GPU's used memory "
                "(no per-process row here), sampled every 0.5 s"}


def peak_memory(engine: Engine, metrics: dict[str, float],
                sampler: GpuMemorySampler | None) -> dict:
    """{"bytes", "source"} from the best source this build and machine offer, so far (the
    sampler goes on sampling)."""
    if DEVICE_PEAK in metrics:
        return {"bytes": int(metrics[DEVICE_PEAK]), "source": f"the engine's {DEVICE_PEAK}"}
    if sampler:
        return sampler.peak()
    if engine.device == "cpu":
        return {"bytes": engine.peak_rss(), "source": "VmHWM of the engine process"}
    return {"bytes": 0, "source": f"none: the engine exposes no {DEVICE_PEAK} "
            "(torch.cuda.max_memory_reserved is not reachable from outside) and nvidia-smi "
            "is missing"}
