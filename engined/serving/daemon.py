"""`kimi-engine serve`, start to finish: plan -> cap -> load -> listen -> serve -> drain.

Exit status: 0 after a clean shutdown, 1 when the model cannot be loaded, the memory plan
exceeds the cap, the socket is in use, or its directory is one another user could control.
"""
import gc
import signal
import sys
import threading
import time

from engined import helper
from engined.weights import hugepages, loader
from engined.weights.hub import ids, pull
from engined.engine import kernels
from engined.engine import memory as memcap
from engined.chat import IncrementalDecoder
from engined.config import DEFAULT_MAX_CONTEXT, EngineConfig, check_socket_dir
from engined.engine.loop import Engine
from engined.layers import route_trace
from engined.serving.generate import Served
from engined.serving.http_server import UnixHTTPServer
from engined.serving.listen import Listener, SocketInUse, check_socket_path
from engined.serving.logs import LogSink
from engined.metrics import EngineMetrics
from engined.serving.routes import App
from kimi_common.notify import sd_notify


class StartupError(RuntimeError):
    """The daemon cannot start; the message says why and what to change."""


class Signals:
    """Handlers only set flags; the main loop acts on them (no locks in signal context)."""

    def __init__(self):
        self.is_stop_requested = False
        self.is_reopen_requested = False

    def install_reopen(self):
        signal.signal(signal.SIGHUP, self._on_hup)

    def install_stop(self):
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)

    def _on_hup(self, signum, frame):
        self.is_reopen_requested = True

    def _on_stop(self, signum, frame):
        self.is_stop_requested = True


def run(config: EngineConfig) -> int:
    try:
        log = LogSink(config.log_file)
    except OSError as exc:
        print(f"kimi-engine: cannot open --log-file {config.log_file}: {exc.strerror}",
              file=sys.stderr)
        return 1
    signals = Signals()
    signals.install_reopen()
    try:
        served, metrics, engine = _load(config, log)
        listener = Listener(config.socket)
    except (StartupError, SocketInUse, memcap.MemoryCapError, helper.HelperError,
            ValueError, OSError) as exc:  # ModelLoadError and the chat errors are ValueErrors
        log.write(f"kimi-engine: {exc}")
        return 1
    except KeyboardInterrupt:
        log.write("kimi-engine: interrupted while starting")
        return 130
    server = UnixHTTPServer(listener.sock, App(served, metrics, log), config.max_connections)
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                               name="kimi-accept")
    signals.install_stop()
    serving.start()
    log.write(f"kimi-engine: serving {served.model_id} on {config.socket} "
              f"(max context {served.max_context} tokens)")
    sd_notify(f"READY=1\nSTATUS=serving {served.model_id}")
    while not signals.is_stop_requested:
        time.sleep(0.2)
        if signals.is_reopen_requested:
            signals.is_reopen_requested = False
            log.reopen()
            log.write("kimi-engine: log file reopened")
    _drain(server, serving, listener, engine, log)
    return 0


def _load(config: EngineConfig, log: LogSink) -> tuple[Served, EngineMetrics, Engine]:
    check_socket_dir(config.socket.parent)  # fail before minutes of loading, not after
    check_socket_path(config.socket)
    device = _device(config.device)
    moved = kernels.settle(device)
    if moved:
        log.write(f"kimi-engine: {kernels.describe_fallback(moved)}")
    hub_id = ids.parse(config.model)
    if hub_id is not None:  # ORG/REPO: held in the cache, else pulled now (never under systemd)
        pull.ensure(hub_id, lambda line: log.write(f"kimi-engine: {line}"))
    plan = loader.plan_model(config.model, device=device)
    max_context = _max_context(config.max_context, plan.context_length)
    memory = memcap.plan_memory(plan, config, device, max_context)
    offload = _log_placement(memory.placement, config, device, log)
    on_cuda = device.startswith("cuda")
    log.write(f"kimi-engine: memory plan: {memory.budget.describe()}")
    if on_cuda:
        memcap.check_host(memory.in_ram, config.memory_cap)
    memcap.enforce(memory.budget)
    if memcap.settle_allocator(memory.in_ram if on_cuda else plan.weight_bytes):
        log.write("kimi-engine: freed prefill buffers go back to the kernel at once "
                  "(a model of a GiB or more in RAM)")
    sd_notify(f"STATUS=loading {config.model} on {device}")
    log.write(f"kimi-engine: loading model {config.model!r} on {device}")
    start = time.monotonic()
    slots = memory.placement.cache_slots if memory.placement else 0
    trace = route_trace.from_env()  # KIMI_ROUTE_TRACE, a benchmark's (bench/offload.py)
    loaded = loader.load_model(config.model, device=device, threads=config.threads or None,
                               offload=offload, cache_slots=slots, moe_w4a8=config.moe_w4a8)
    seconds = time.monotonic() - start
    log.write(f"kimi-engine: loaded {loaded.model_id} from {loaded.source} in {seconds:.1f} s")
    if trace is not None:  # refused here if it does not fit; followed once graphs are captured
        traced, follow = route_trace.followers(loaded.model, trace, offload)
    if config.moe_w4a8:
        log.write("kimi-engine: the routed experts the CPU runs are W4A8 (--moe-w4a8)"
                  if device == "cpu" or offload else "kimi-engine: --moe-w4a8: every routed "
                  "expert is on the GPU, which runs them in W4A16; nothing changes")
    if device == "cpu" and helper.available():
        log.write(f"kimi-engine: {_cpu_kernels(loaded.model)}")
    huge = hugepages.describe()  # reads /proc/self/smaps: once
    if huge:
        log.write(f"kimi-engine: {huge}")
    metrics = EngineMetrics()
    metrics.load_time.set(seconds)
    if loaded.offload_counters is not None:
        metrics.watch_offload(loaded.offload_counters)
    engine = Engine(loaded.model, max_context, metrics, config.threads, log.write,
                    max_batch=config.max_batch, prefill_chunk=config.prefill_chunk_on(device),
                    prefix_cache_bytes=config.prefix_cache_bytes, max_queue=config.max_queue,
                    enforce_eager=config.enforce_eager, speculative=config.speculative)
    # The model, tokenizer and engine live as long as the process: out of the collector's
    # sight, so that a full collection never walks them on the model thread (with SmolLM2
    # loaded, 181k objects and 85 ms a full collection; the younger ones took ~1.5% of a step)
    gc.freeze()
    engine.start()
    if trace is not None:  # the model thread waits for requests, and none can come yet
        follow()
        log.write(f"kimi-engine: {traced}")
    served = Served(engine, loaded.tokenizer, loaded.chat, loaded.model_id, max_context,
                    IncrementalDecoder, created=int(time.time()),
                    queue_timeout_s=config.queue_timeout_s)
    return served, metrics, engine


def _cpu_kernels(model) -> str:
    """Which SIMD kernels this CPU runs, chosen at run time: one line for the log."""
    line = (f"CPU kernels: {helper.SIMD_LEVELS[helper.gemv_simd()]} fp32 dots, "
            f"{helper.INT8_LEVELS[helper.w4a8_simd()]} integer dots")
    if model.decode_gemv in ("w4a8_tiles", "w4a16_tiles"):
        return f"{line}; projections {model.decode_gemv} ({helper.tiles_kernels()})"
    return f"{line}; decode GEMV {model.decode_gemv}" if model.decode_gemv else line


def _log_placement(placement, config: EngineConfig, device: str, log) -> frozenset:
    """Log where the routed experts live -> the MoE layers whose experts stay in RAM."""
    if placement is None:
        if config.cpu_moe or config.n_cpu_moe:
            log.write("kimi-engine: --cpu-moe/--n-cpu-moe: this model has no routed experts; "
                      "nothing moves")
        return frozenset()
    for line in placement.describe():
        log.write(f"kimi-engine: {line}")
    if placement.offloaded and device.startswith("cuda") and not config.enforce_eager:
        log.write(f"kimi-engine: decode is captured piecewise: {len(placement.offloaded) + 1} "
                  "graph segments, the offloaded MoE layers' CPU experts between them")
    return placement.offloaded


def _drain(server, serving: threading.Thread, listener: Listener, engine: Engine, log):
    """Stop accepting, let in-flight requests finish, remove the socket, stop the model."""
    sd_notify("STOPPING=1")
    log.write("kimi-engine: stopping: draining in-flight requests")
    server.is_draining = True
    server.shutdown()
    serving.join()
    listener.remove()
    server.server_close()  # joins the handler threads
    engine.stop()
    log.write("kimi-engine: stopped")
    log.close()


def _max_context(requested: int, model_context: int) -> int:
    if not requested:
        return min(model_context, DEFAULT_MAX_CONTEXT)
    if requested > model_context:
        raise StartupError(f"--max-context {requested} exceeds the model's context length "
                           f"{model_context}")
    return requested


def _device(requested: str) -> str:
    import torch

    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise StartupError("--device cuda: no CUDA device is available (use auto or cpu)")
    return "cuda" if requested == "cuda" or requested == "auto" and has_cuda else "cpu"
