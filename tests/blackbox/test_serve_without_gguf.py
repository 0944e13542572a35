"""The serve path as on the GPU image, which has no gguf, cffi, numpy or compiled C helper.

A `sitecustomize` on PYTHONPATH makes those modules unimportable in a subprocess, as there. The
Kimi-Linear serve path must import without trying gguf at all, and `kimi-engine serve` must
answer a completion for a synthetic model and for a checkpoint directory on the CPU: the INT4
ops run their reference kernels, the memory cap is counted without the helper."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.support import kimi_tiny
from tests.support.engine import Daemon, metric, post, short_tmpdir

BLOCKED = ("gguf", "cffi", "_cffi_backend", "engined._kimi_helper", "numpy")
BLOCKER = f'''
import importlib.abc, sys
BLOCKED = {BLOCKED!r}
ATTEMPTS = []
class NotOnGpuImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            ATTEMPTS.append(name)
            raise ModuleNotFoundError("not on the GPU image: " + name, name=name)
sys.meta_path.insert(0, NotOnGpuImage())
'''
SERVE_PATH = """
import sys, sitecustomize
import engined.__main__, engined.serving.daemon, engined.weights.loader
import engined.weights.kimi_checkpoint, engined.weights.synthetic
import engined.models.kimi_linear, engined.engine.loop, engined.engine.kernels
from engined import helper
tried = sorted(set(sitecustomize.ATTEMPTS) - {"numpy"})
try:
    import gguf
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("the blocker let gguf through")
print("available", helper.available())
print("imported", sorted(m for m in sys.modules if m.split(".")[0] in {"gguf", "cffi", "numpy"}
                         or m in {"_cffi_backend", "engined._kimi_helper"}))
print("tried", tried)
"""
CHAT = {"model": "any", "temperature": 0, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
def gpu_image_env(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "KIMI_KERNELS": ""}


@pytest.fixture
def workdir():
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_serve_path_imports_without_gguf_cffi_numpy_or_helper(gpu_image_env):
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", SERVE_PATH], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **gpu_image_env})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["available"] == "False"
    assert lines["imported"] == "[]"
    # torch probes numpy and engined/helper/ its compiled module, and both cope; gguf is never tried
    assert "gguf" not in lines["tried"], lines["tried"]


def _serve_one(daemon: Daemon) -> dict:
    try:
        daemon.start(timeout=300)
        reply = post(daemon.sock, "/v1/chat/completions", CHAT)
        assert reply.status == 200, reply.text
        assert metric(daemon.sock, "kimi_engine_memory_reserved_bytes") > 0  # the weights
    finally:
        status = daemon.stop()
    assert status == 0, daemon.stderr()
    return reply.json()


def test_synthetic_model_serves_on_reference_kernels(gpu_image_env, workdir):
    daemon = Daemon(workdir / "cache", "--model", "synthetic:small", "--device", "cpu",
                    "--max-context", "256", "--memory-cap", "1GiB", env=gpu_image_env,
                    workdir=workdir)
    body = _serve_one(daemon)
    assert body["usage"]["completion_tokens"] == 4
    log = daemon.stderr()
    assert "w4a16_gemv" in log and "run their reference kernels on the CPU" in log, log
    assert "C helper not built" in log and "Traceback" not in log, log


def test_checkpoint_dir_serves_without_numpy(gpu_image_env, workdir, tmp_path):
    checkpoint = kimi_tiny.write_tiny_checkpoint(tmp_path / "bf16")
    daemon = Daemon(workdir / "cache", "--model", str(checkpoint), "--device", "cpu",
                    "--max-context", "256", env=gpu_image_env, workdir=workdir)
    assert _serve_one(daemon)["usage"]["completion_tokens"] >= 1


def test_helper_kernel_pinned_without_helper_is_refused_at_start(gpu_image_env, workdir):
    env = dict(gpu_image_env, KIMI_KERNELS="w4a16_gemv=cpu_c")
    daemon = Daemon(workdir / "cache", "--model", "synthetic:small", "--device", "cpu",
                    env=env, workdir=workdir)
    try:
        with pytest.raises(RuntimeError, match="exited 1"):
            daemon.start(timeout=120)
    finally:
        daemon.stop()
    assert "KIMI_KERNELS selects w4a16_gemv=cpu_c, which needs the C helper" in daemon.stderr()
