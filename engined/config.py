"""Engine configuration: one frozen dataclass, layered and validated once.

Layers, lowest to highest: defaults -> `--config` TOML file -> `KIMI_ENGINE_<KEY>`
environment -> command-line flags. Keys are the long option names (`memory-cap`).
"""
import dataclasses
import os
import pathlib
import re
import stat
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping

ENV_PREFIX = "KIMI_ENGINE_"
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_MAX_CONTEXT = 8192  # used when the model allows more; bounds the planned KV cache
MOE_CACHE_AUTO = -1  # --moe-cache auto: what the GPU budget leaves after the plan
# --prefill-chunk by device, when not given. The CPU: a 256-token chunk of the default model
# takes ~0.13 s, the longest another request's next token then waits. A GPU: a chunk is
# launch-bound at that size (the 48B's prefill launches ~84 kernels a layer a chunk whatever its
# tokens: a 32k prompt in 128 chunks is ~290,000 launches, in 16 of 2048 ~36,000).
DEFAULT_PREFILL_CHUNK = {"cpu": 256, "cuda": 2048}

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid; the message says which."""


def parse_size(value: Any, what: str = "size") -> int:
    """600MB (decimal), 2GiB or 2G (binary), 1234 (bytes) -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size like 600MB or 2GiB, got {value!r}")
    if isinstance(value, int):
        number, unit = value, ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(f"{what}: expected a size like 600MB, 2GiB or a byte count, "
                              f"got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    nbytes = int(number * _SIZE_UNITS[unit])
    if nbytes < 0:
        raise ConfigError(f"{what}: must not be negative, got {value!r}")
    return nbytes


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def default_socket_path(env: Mapping[str, str] = os.environ) -> pathlib.Path:
    """$RUNTIME_DIRECTORY/engine.sock, else $XDG_RUNTIME_DIR/kimi/engine.sock,
    else /tmp/kimi-$UID/engine.sock. Creates nothing."""
    if env.get("RUNTIME_DIRECTORY"):
        # systemd may list several directories separated by colons; the first is ours.
        return pathlib.Path(env["RUNTIME_DIRECTORY"].split(":")[0]) / "engine.sock"
    if env.get("XDG_RUNTIME_DIR"):
        return pathlib.Path(env["XDG_RUNTIME_DIR"]) / "kimi" / "engine.sock"
    return pathlib.Path(f"/tmp/kimi-{os.getuid()}") / "engine.sock"


def cache_dir(env: Mapping[str, str] = os.environ) -> pathlib.Path:
    """$CACHE_DIRECTORY (systemd; first entry) else $XDG_CACHE_HOME/kimi else ~/.cache/kimi:
    the repacked default model and the tokenizer text cache. Creates nothing."""
    systemd = env.get("CACHE_DIRECTORY", "").split(":")[0]
    if systemd:
        return pathlib.Path(systemd)
    xdg = env.get("XDG_CACHE_HOME")
    return pathlib.Path(xdg) / "kimi" if xdg else pathlib.Path.home() / ".cache" / "kimi"


class UnsafeSocketDir(ConfigError):
    """The socket's directory is one another user could control: they could replace the
    socket with their own, or have made the directory first (the /tmp fallback)."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


def ensure_socket_dir(socket_path: pathlib.Path):
    """Create missing parents of the socket with mode 0700 (existing ones are left alone),
    then refuse a socket directory another user could control (check_socket_dir)."""
    missing = [p for p in reversed(socket_path.parents) if not os.path.lexists(p)]
    for directory in missing:
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile, maybe by someone else: judged below, never chmod-ed
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
    check_socket_dir(socket_path.parent)


def check_socket_dir(directory: pathlib.Path):
    """Raise UnsafeSocketDir when the existing `directory` is a symlink, is owned by neither
    this user nor root, or is group- or world-writable. A missing one passes."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    other = "choose another --socket (or set XDG_RUNTIME_DIR to a directory of your own)"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeSocketDir(f"socket directory {directory} is a symlink, which whoever made "
                              "it can point anywhere", f"remove the link, or {other}")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeSocketDir(f"socket directory {directory} is not a directory", other)
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        raise UnsafeSocketDir(
            f"socket directory {directory} belongs to uid {st.st_uid}, not to uid {uid} that "
            "runs the engine: that user could replace the socket with one of their own",
            f"have it removed, or {other}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        kind = "world-writable" if mode & 0o002 else "group-writable"
        raise UnsafeSocketDir(
            f"socket directory {directory} (mode {mode:04o}) is {kind}: others could replace "
            "the socket with one of their own",
            f"chmod 0700 {directory} (0750 to let a group reach the socket), or {other}")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"
    socket: pathlib.Path = None  # None -> default_socket_path()
    device: str = "auto"
    memory_cap: int = 0  # bytes; 0 = no cap of our own
    max_context: int = 0  # tokens; 0 = min(model context, DEFAULT_MAX_CONTEXT)
    threads: int = 0  # 0 = torch's default
    log_file: pathlib.Path = None  # None -> stderr
    max_batch: int = 8  # running sequences, decoded together
    prefill_chunk: int = 0  # prompt tokens per prefill step; 0 = the device's default
    prefix_cache_bytes: int = 256 * 2**20  # 0 = no prefix cache
    max_queue: int = 16  # requests waiting to start; more get 429; 0 = no bound
    queue_timeout_s: float = 120.0  # longest wait to start, then 503; 0 = no limit
    max_connections: int = 64  # connection threads; at the cap idle ones close, then 503
    enforce_eager: bool = False  # no CUDA graphs: every decode step runs eagerly (vLLM's name)
    speculative: bool = True  # drafts from the context verified in decode steps ("on"/"off")
    cpu_moe: bool = False  # every MoE layer's routed experts in RAM (llama.cpp's name)
    n_cpu_moe: int = 0  # the routed experts of the first N MoE layers in RAM
    gpu_memory: int = 0  # bytes the GPU may hold; 0 = its free memory minus a margin
    moe_cache: int | str = "auto"  # bytes of GPU expert cache for experts in RAM; 0 = off
    moe_w4a8: bool = False  # the routed experts the CPU runs in W4A8 (opt-in)

    def prefill_chunk_on(self, device: str) -> int:
        """--prefill-chunk, else the default of the device the model runs on ("cpu", "cuda",
        "cuda:N"): DEFAULT_PREFILL_CHUNK."""
        return self.prefill_chunk or DEFAULT_PREFILL_CHUNK["cuda" if device.startswith("cuda") else "cpu"]

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("model: expected 'default' or a path")
        set_("socket", pathlib.Path(self.socket) if self.socket else default_socket_path())
        if self.device not in DEVICES:
            raise ConfigError(f"device: expected one of {', '.join(DEVICES)}, got {self.device!r}")
        set_("memory_cap", parse_size(self.memory_cap, "memory-cap"))
        set_("max_context", _non_negative_int(self.max_context, "max-context"))
        set_("threads", _non_negative_int(self.threads, "threads"))
        set_("max_batch", _bounded_int(self.max_batch, "max-batch", 1, 256))
        set_("prefill_chunk", _bounded_int(self.prefill_chunk, "prefill-chunk", 0, 1 << 20))
        set_("prefix_cache_bytes", parse_size(self.prefix_cache_bytes, "prefix-cache-bytes"))
        set_("max_queue", _non_negative_int(self.max_queue, "max-queue"))
        set_("queue_timeout_s", _non_negative_float(self.queue_timeout_s, "queue-timeout-s"))
        set_("max_connections", _bounded_int(self.max_connections, "max-connections", 1, 1 << 16))
        set_("enforce_eager", _bool(self.enforce_eager, "enforce-eager"))
        set_("speculative", _bool(self.speculative, "speculative"))
        set_("cpu_moe", _bool(self.cpu_moe, "cpu-moe"))
        set_("moe_w4a8", _bool(self.moe_w4a8, "moe-w4a8"))
        set_("n_cpu_moe", _non_negative_int(self.n_cpu_moe, "n-cpu-moe"))
        set_("gpu_memory", parse_size(self.gpu_memory, "gpu-memory"))
        set_("moe_cache", MOE_CACHE_AUTO if str(self.moe_cache).strip().lower() in ("auto", "-1")
             else parse_size(self.moe_cache, "moe-cache"))
        if self.log_file:
            set_("log_file", pathlib.Path(self.log_file))

    @classmethod
    def layered(cls, flags: Mapping[str, Any], env: Mapping[str, str] = os.environ,
                config_file: str | os.PathLike | None = None) -> "EngineConfig":
        """flags: option name -> value, None when not given on the command line."""
        values: dict[str, Any] = {}
        if config_file:
            values.update(read_toml(config_file))
        for name in _field_names():
            env_value = env.get(ENV_PREFIX + name.upper())
            if env_value not in (None, ""):
                values[name] = env_value
        values.update({_field_name(k): v for k, v in flags.items() if v is not None})
        return cls(**values)


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from exc
    known = {name.replace("_", "-") for name in _field_names()}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"config file {path}: unknown key(s) {', '.join(unknown)}; "
                          f"known keys: {', '.join(sorted(known))}")
    return {_field_name(key): value for key, value in raw.items()}


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(EngineConfig)]


def _field_name(option: str) -> str:
    return option.replace("-", "_")


def _non_negative_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a whole number, got {value!r}")
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ConfigError(f"{what}: expected a whole number, got {value!r}") from None
    if number < 0:
        raise ConfigError(f"{what}: must not be negative, got {value!r}")
    return number


def _bounded_int(value: Any, what: str, low: int, high: int) -> int:
    number = _non_negative_int(value, what)
    if not low <= number <= high:
        raise ConfigError(f"{what}: expected {low}..{high}, got {value!r}")
    return number


def _bool(value: Any, what: str) -> bool:
    """A flag from TOML (true/false), the environment ("1", "true", "0", "false") or the CLI."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{what}: expected true or false, got {value!r}")


def _non_negative_float(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a number of seconds, got {value!r}")
    try:
        number = float(str(value).strip()) if not isinstance(value, (int, float)) else value
    except ValueError:
        raise ConfigError(f"{what}: expected a number of seconds, got {value!r}") from None
    if not 0 <= number < float("inf"):
        raise ConfigError(f"{what}: must be 0 or more seconds, got {value!r}")
    return float(number)
