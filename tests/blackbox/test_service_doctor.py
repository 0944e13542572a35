"""`kimi-engine doctor`: one line per check, a fix on each failure, exit 0 only when all pass."""
import os
import re
import shutil
import socket
import subprocess

import pytest
import torch

from tests.support.engine import BIN, short_tmpdir
from engined.commands import doctor
from engined.config import EngineConfig
from tests.blackbox.service_helpers import ROOT

CHECK_NAMES = ["python", "torch", "triton", "fla-core", "C helper", "gpu", "model", "memory plan",
               "huge pages", "cache dir", "disk", "hub", "socket"]


@pytest.fixture
def workdir():
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_doctor(*args, cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    for name in ("CACHE_DIRECTORY", "RUNTIME_DIRECTORY"):
        env.pop(name, None)
    return subprocess.run([str(BIN / "kimi-engine"), "doctor", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def lines_by_check(stdout: str) -> dict[str, str]:
    """Check name -> its line, with any indented continuation lines (the placement table)."""
    out, name = {}, None
    for line in stdout.splitlines():
        if line.startswith("    ") and name:
            out[name] += "\n" + line
            continue
        match = re.match(r"(ok|x ) (.+?)(?: /\S+)?: ", line)
        assert match, f"not a check line: {line!r}"
        name = match.group(2)
        out[name] = line
    return out


def test_pins_are_the_constraints():
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    assert pins == doctor.PINS


def test_all_checks_pass_on_this_setup(tmp_path, workdir):
    result = run_doctor("--socket", str(workdir / "run" / "engine.sock"), cache=tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = lines_by_check(result.stdout)
    assert list(checks) == CHECK_NAMES
    assert all(line.startswith("ok ") for line in checks.values())
    if not torch.cuda.is_available():
        assert checks["gpu"] == "ok gpu: no GPU: CPU mode"
    assert "will be created with mode 0700" in checks["socket"]
    assert "repacked on first start" in checks["model"]
    assert not (workdir / "run").exists() and not (tmp_path / "cache").exists()  # creates nothing


def test_failures_exit_1_with_a_fix_each(tmp_path, workdir):
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(workdir / "engine.sock"))
    live.listen(1)
    try:
        result = run_doctor("--socket", str(workdir / "engine.sock"), "--memory-cap", "1KiB",
                            cache=tmp_path / "cache")
    finally:
        live.close()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    checks = lines_by_check(result.stdout)
    assert list(checks) == CHECK_NAMES
    assert checks["memory plan"].startswith("x ") and "raise --memory-cap" in checks["memory plan"]
    assert checks["socket"].startswith("x ") and "already listening" in checks["socket"]
    assert "(fix: stop the other kimi-engine" in checks["socket"]
    assert checks["torch"].startswith("ok ")


def test_bad_config_is_a_usage_error(workdir):
    (workdir / "engine.toml").write_text("bogus = 1\n")
    result = run_doctor("--config", str(workdir / "engine.toml"), cache=workdir)
    assert result.returncode == 2 and "unknown key(s) bogus" in result.stderr


def test_missing_model_fails_with_a_fix(kimi_cache):
    config = EngineConfig(model="/nonexistent/model.gguf", socket="/tmp/x")
    check = doctor.check_model(config)
    assert not check.is_ok and "no such file" in check.detail
    assert "(fix: set model to an existing GGUF file" in check.line()
    plan = doctor.check_memory_plan(config)
    assert not plan.is_ok and "see the model line" in plan.line()


@pytest.mark.parametrize("setup,expected", [
    (lambda d: os.chmod(d, 0o777), "world-writable"),
    (lambda d: (d / "engine.sock").write_text("not a socket"), "is not a socket"),
])
def test_socket_directory_rules(workdir, setup, expected):
    setup(workdir)
    check = doctor.check_socket(EngineConfig(socket=workdir / "engine.sock"))
    assert not check.is_ok and expected in check.detail, check.line()


def test_socket_path_too_long():
    check = doctor.check_socket(EngineConfig(socket="/tmp/" + "s" * 120 + "/engine.sock"))
    assert not check.is_ok and "longer than a Unix socket allows" in check.detail


def test_gpu_check_follows_the_device(kimi_cache):
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        over = doctor.check_gpu(EngineConfig(gpu_memory=2 * total))
        assert not over.is_ok and "less than gpu-memory" in over.detail
    else:
        assert doctor.check_gpu(EngineConfig(device="auto")).detail == "no GPU: CPU mode"
        forced = doctor.check_gpu(EngineConfig(device="cuda"))
        assert not forced.is_ok and "no CUDA device" in forced.detail


@pytest.mark.parametrize("device,cuda,w4a8,is_ok", [
    ("auto", True, False, True), ("cuda", True, False, True), ("cuda", True, True, False),
    ("cpu", True, False, False), ("auto", False, False, False)])
def test_the_helper_is_needed_on_the_cpu_not_on_a_gpu(monkeypatch, device, cuda, w4a8, is_ok):
    """Without the C helper: a GPU serve runs (only experts in RAM, which the memory plan
    refuses without it, and --moe-w4a8 use it); a CPU serve falls back to reference kernels."""
    from engined import helper

    def missing():
        raise helper.HelperError("C helper not built")

    monkeypatch.setattr(helper, "require", missing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    check = doctor.check_helper(EngineConfig(device=device, moe_w4a8=w4a8))
    assert check.is_ok == is_ok and check.detail.startswith("C helper not built"), check
    if not is_ok:
        assert "make setup" in check.fix


@pytest.mark.parametrize("device,cuda,is_ok", [
    ("auto", True, False), ("cuda", True, False), ("cpu", True, True), ("auto", False, True)])
def test_fla_core_is_needed_for_a_gpus_prefill_only(monkeypatch, device, cuda, is_ok):
    """Without fla-core a GPU serve would fail every Kimi-Linear prompt longer than a token
    (its KDA prefill); the CPU runs its own chunked form."""
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name == "fla-core":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    check = doctor.check_fla(EngineConfig(device=device))
    assert check.is_ok == is_ok, check
    assert check.fix.startswith("pip install -c constraints.txt fla-core==0.6.0") or is_ok
    assert doctor.check_fla(EngineConfig(device="cpu")).is_ok


def test_a_check_that_raises_is_one_failed_line():
    def check_boom(config):
        raise RuntimeError("boom")

    check = doctor._guarded(check_boom, EngineConfig())
    assert not check.is_ok and check.line().startswith("x  boom: RuntimeError: boom")


def test_kimi_artifact_manifest_is_checked(tmp_path, kimi_cache):
    from tests.support import kimi_tiny
    from engined.weights.quantize import quantize_checkpoint

    src = kimi_tiny.write_tiny_checkpoint(tmp_path / "src")
    dst = tmp_path / "int4"
    quantize_checkpoint(src, dst, progress=False)
    good = doctor.check_model(EngineConfig(model=str(dst)))
    assert good.is_ok and "manifest matches" in good.detail, good.line()
    assert doctor.check_model(EngineConfig(model=str(src))).is_ok  # BF16: headers only
    shard = sorted(dst.glob("*.safetensors"))[0]
    with open(shard, "ab") as f:
        f.write(b"\0")
    bad = doctor.check_model(EngineConfig(model=str(dst)))
    assert not bad.is_ok and "size" in bad.detail and "kimi-engine quantize" in bad.fix


def test_systemd_made_directories_count_as_present(tmp_path, monkeypatch):
    """Before the first start /run/kimi and /var/cache/kimi do not exist yet, and the
    service user cannot create them: systemd does, from RuntimeDirectory=/CacheDirectory=."""
    locked = tmp_path / "locked"
    locked.mkdir()
    run_dir, cache_dir = locked / "run-kimi", locked / "cache-kimi"
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(run_dir))
    monkeypatch.setenv("CACHE_DIRECTORY", str(cache_dir))
    monkeypatch.setattr(doctor.os, "access", lambda path, mode: False)  # as user kimi would see
    socket_check = doctor.check_socket(EngineConfig())
    assert socket_check.is_ok and "RuntimeDirectory=" in socket_check.detail
    assert str(run_dir / "engine.sock") in socket_check.name
    cache_check = doctor.check_cache_dir(EngineConfig())
    assert cache_check.is_ok and "CacheDirectory=" in cache_check.detail
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    other = doctor.check_socket(EngineConfig(socket=run_dir / "engine.sock"))
    assert not other.is_ok and "not writable" in other.detail


def test_proxy_doctor_leaves_the_state_directory_to_systemd(tmp_path):
    """kimi-proxy doctor: upstream, ledger and port; a missing StateDirectory= is no failure,
    but an unusable ledger elsewhere is."""
    from tests.support.proxy_fakes import FakeUpstream
    from tests.blackbox.service_helpers import free_port

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    env = {**os.environ, "STATE_DIRECTORY": str(blocker / "kimi-proxy")}
    port = free_port()
    with FakeUpstream().serve() as upstream:
        ok = subprocess.run([str(BIN / "kimi-proxy"), "doctor", "--upstream", upstream, "--port",
                             str(port)], capture_output=True, text=True, timeout=60, env=env)
        bad = subprocess.run([str(BIN / "kimi-proxy"), "doctor", "--upstream", upstream, "--port",
                              str(port), "--ledger", str(blocker / "x" / "ledger.sqlite")],
                             capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "StateDirectory=" in ok.stdout and f"ok port 127.0.0.1:{port}" in ok.stdout
    assert bad.returncode == 1 and "x ledger" in bad.stdout and "Traceback" not in bad.stderr


def test_memory_plan_shows_where_each_part_lives(tmp_path, workdir):
    """Issue 17: for a MoE model the plan lists bytes on the GPU and in RAM per part, from
    the headers alone; a placement that cannot be met is a failed line with its numbers."""
    sock = str(workdir / "run" / "engine.sock")
    result = run_doctor("--socket", sock, "--model", "synthetic:small", "--cpu-moe",
                        "--device", "cpu", cache=tmp_path / "cache")
    plan = lines_by_check(result.stdout)["memory plan"]
    assert plan.startswith("ok ")
    for part in ("attention", "shared experts", "routed experts", "cache", "total"):
        assert re.search(rf"^\s+{part}\s+0 B\s+\d", plan, re.M), (part, plan)
    assert "routed experts of 7 of 7 MoE layers in RAM (layers 1..7)" in plan
    refused = run_doctor("--socket", sock, "--model", "synthetic:small", "--n-cpu-moe", "8",
                         "--device", "cpu", cache=tmp_path / "cache")
    line = lines_by_check(refused.stdout)["memory plan"]
    assert refused.returncode == 1 and line.startswith("x ")
    assert "--n-cpu-moe 8: this model has 7 MoE layers, so it must be 0..7" in line


@pytest.mark.parametrize("mode", ["madvise", "always", "never", ""])
def test_the_huge_pages_line_says_where_the_weights_go(monkeypatch, mode):
    """A performance note, never a failure: with THP off it says how to turn it on."""
    from engined.weights import hugepages
    monkeypatch.setattr(hugepages, "thp_mode", lambda: mode)
    check = doctor.check_huge_pages(EngineConfig())
    assert check.is_ok
    if mode in ("madvise", "always"):
        assert f"transparent huge pages {mode}: " in check.detail and "2 MiB pages" in check.detail
    else:
        assert "stay in 4 KiB pages" in check.detail and "echo madvise >" in check.detail


def test_doctor_prints_the_expert_cache_the_gpu_plan_gives(monkeypatch):
    """Issue 30: `kimi-engine doctor` on a GPU prints the --moe-cache default the planner
    sized: whole experts (3,981,312 B each at the 48B's shapes) in what the 24 GiB budget
    leaves, less than one expert unplanned; and the cache off when asked. The GPU is stood
    in for (80 GiB, 40 free)."""
    GiB, expert = 2**30, 3_981_312
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a test GPU")
    config = EngineConfig(model="synthetic:kimi-linear-48b", gpu_memory="24GiB", max_context=32768)
    check = doctor.check_memory_plan(config)
    assert check.is_ok, check
    found = re.search(r"routed experts of (\d+) of 26 MoE layers in RAM.*\n *expert cache: "
                      r"(\d+) experts, ([\d.]+) MiB \(--moe-cache\)", check.detail)
    assert found and int(found[1]) > 0, check.detail
    slots, mib = int(found[2]), float(found[3])
    assert slots > 0 and abs(slots * expert / 2**20 - mib) < 0.05
    unplanned = re.search(r"GPU budget 24.0 GiB, ([\d.]+) MiB of it unplanned", check.detail)
    assert unplanned and float(unplanned[1]) * 2**20 < expert
    off = doctor.check_memory_plan(EngineConfig(model="synthetic:kimi-linear-48b",
                                                gpu_memory="24GiB", max_context=32768, moe_cache=0))
    assert "expert cache: off" in off.detail
