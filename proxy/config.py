"""Proxy configuration: defaults -> --config TOML file -> KIMI_PROXY_* env -> CLI flags.

Keys in the TOML file are the long option names (`upstream`, `reasoning-field`,
`model-alias = ["a=b"]`, ...); environment variables are `KIMI_PROXY_` plus the name
upper-cased with dashes as underscores. Everything is validated once, in `validate`,
with messages that name the key. Flask config keys are the upper-cased names.
"""
from __future__ import annotations

import functools
import os
import pwd
import tomllib
from ipaddress import ip_address

ENV_PREFIX = "KIMI_PROXY_"
REASONING_FIELDS = ("auto", "reasoning_content", "reasoning", "inline", "none")
MAX_BODY_BYTES = 32 * 1024 * 1024


def default_socket_path(environ=None) -> str:
    """The engine's default socket: $RUNTIME_DIRECTORY/engine.sock, else
    $XDG_RUNTIME_DIR/kimi/engine.sock, else /tmp/kimi-$UID/engine.sock.

    kimi-engine's rule (engined.config.default_socket_path), kept here because the two
    daemons only ever meet over the socket; tests/proxy/test_boundary.py pins them equal."""
    environ = os.environ if environ is None else environ
    if environ.get("RUNTIME_DIRECTORY"):
        return os.path.join(environ["RUNTIME_DIRECTORY"].split(":")[0], "engine.sock")
    if environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(environ["XDG_RUNTIME_DIR"], "kimi", "engine.sock")
    return f"/tmp/kimi-{os.getuid()}/engine.sock"


def default_ledger_path(environ=None) -> str:
    from proxy.state.store import default_db_path
    return str(default_db_path(os.environ if environ is None else environ))


DEFAULTS = {
    "UPSTREAM": None,            # None: unix:// + the engine's default socket
    "HOST": "127.0.0.1",
    "PORT": 8080,
    "CLIENT": "auto",
    "REASONING_FIELD": "auto",
    "TOOL_PARSER": "auto",
    "MODEL": None,               # None: the client's model name goes upstream
    "MODEL_ALIAS": {},
    "SMALL_MODEL": None,
    "LEDGER": None,
    "API_KEY": None,
    "UPSTREAM_API_KEY": None,
    "ENGINE_USER": None,         # the engine socket's user, trusted besides ours and root
    "LOG_FILE": None,
    "RECORD": None,
    "ALLOW_ORIGIN": [],          # browser Origins admitted (exact match)
    "ALLOW_HOST": [],            # non-loopback Host names admitted
    "PING_INTERVAL_S": 10.0,     # keep-alive period while the upstream is quiet
    "UPSTREAM_TIMEOUT_S": 600.0,
    "MAX_BODY_BYTES": MAX_BODY_BYTES,
    "LEDGER_MAX_ENTRIES": 100_000,     # reasoning rows kept (oldest evicted first)
    "LEDGER_TTL_S": 30 * 86400.0,      # reasoning rows and stored Responses expire after this
    "RESPONSES_MAX_ENTRIES": 10_000,   # stored Responses kept for previous_response_id
    "DRAIN_TIMEOUT_S": 25.0,
    "MAX_CONNECTIONS": 256,            # client connections served at once; more wait to be accepted
    "IDLE_TIMEOUT_S": 60.0,            # for a connection's next request line and headers
    "SIDE_MAX_TOKENS": 256,            # max_tokens cap on a client's title request (0: none)           # SIGTERM: open streams get this long (unit: TimeoutStopSec=30s)
}
INTS = {"PORT", "MAX_BODY_BYTES", "LEDGER_MAX_ENTRIES", "RESPONSES_MAX_ENTRIES", "SIDE_MAX_TOKENS",
        "MAX_CONNECTIONS"}
FLOATS = {"PING_INTERVAL_S", "UPSTREAM_TIMEOUT_S", "LEDGER_TTL_S", "DRAIN_TIMEOUT_S", "IDLE_TIMEOUT_S"}
POSITIVE = ("LEDGER_MAX_ENTRIES", "LEDGER_TTL_S", "RESPONSES_MAX_ENTRIES", "MAX_CONNECTIONS",
            "IDLE_TIMEOUT_S")
LISTS = {"MODEL_ALIAS", "ALLOW_ORIGIN", "ALLOW_HOST"}


class ConfigError(ValueError):
    pass


def key_of(name: str) -> str:
    return name.replace("-", "_").upper()


def from_file(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    out = {}
    for name, value in data.items():
        key = key_of(name)
        if key not in DEFAULTS:
            raise ConfigError(f"config file {path}: unknown key {name!r}")
        out[key] = value
    return out


def from_env(environ) -> dict:
    out = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX):] in DEFAULTS:
            key = name[len(ENV_PREFIX):]
            out[key] = [v for v in value.split(",") if v] if key in LISTS else value
    return out


def load(cli: dict | None = None, config_path: str | None = None, environ=None) -> dict:
    """Layer the sources and validate; CLI values of None mean "not given"."""
    environ = os.environ if environ is None else environ
    merged = dict(DEFAULTS)
    path = config_path or environ.get(ENV_PREFIX + "CONFIG")
    if path:
        merged.update(from_file(path))
    merged.update(from_env(environ))
    merged.update({k: v for k, v in (cli or {}).items() if v is not None and v != () and v != []})
    return validate(merged, environ)


def _coerce(key: str, value):
    try:
        if key in INTS:
            return int(value)
        if key in FLOATS:
            return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key.lower().replace('_', '-')} must be a number, got {value!r}") from None
    return value


def _aliases(value) -> dict:
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    items = [value] if isinstance(value, str) else list(value or [])
    out = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item or item.startswith("="):
            raise ConfigError(f"model-alias must look like A=B, got {item!r}")
        a, b = item.split("=", 1)
        out[a] = b
    return out


def validate(cfg: dict, environ=None) -> dict:
    cfg = {k: _coerce(k, v) for k, v in cfg.items()}
    cfg["MODEL_ALIAS"] = _aliases(cfg["MODEL_ALIAS"])
    for key in ("ALLOW_ORIGIN", "ALLOW_HOST"):
        value = cfg[key]
        cfg[key] = [value] if isinstance(value, str) else list(value or [])
    if cfg["UPSTREAM"] is None:
        cfg["UPSTREAM"] = "unix://" + default_socket_path(environ)
    if not str(cfg["UPSTREAM"]).startswith(("unix:///", "http://", "https://")):
        raise ConfigError(f"upstream must be unix:///PATH or http(s)://HOST:PORT/v1, got {cfg['UPSTREAM']!r}")
    for key in POSITIVE:
        if cfg[key] <= 0:
            raise ConfigError(f"{key.lower().replace('_', '-')} must be positive, got {cfg[key]}")
    if not 0 < cfg["PORT"] < 65536:
        raise ConfigError(f"port must be 1..65535, got {cfg['PORT']}")
    if cfg["REASONING_FIELD"] not in REASONING_FIELDS:
        raise ConfigError(f"reasoning-field must be one of {', '.join(REASONING_FIELDS)}, "
                          f"got {cfg['REASONING_FIELD']!r}")
    cfg["ENGINE_USER"] = _engine_uid(cfg["ENGINE_USER"])
    _check_names(cfg)
    _check_exposure(cfg)
    if cfg["LEDGER"] is None:
        cfg["LEDGER"] = default_ledger_path(environ)
    if cfg["PING_INTERVAL_S"] < 0 or cfg["UPSTREAM_TIMEOUT_S"] <= 0 or cfg["MAX_BODY_BYTES"] < 1:
        raise ConfigError("ping-interval-s must be >= 0, upstream-timeout-s and max-body-bytes > 0")
    if cfg["DRAIN_TIMEOUT_S"] < 0:
        raise ConfigError(f"drain-timeout-s must be >= 0, got {cfg['DRAIN_TIMEOUT_S']}")
    if cfg["SIDE_MAX_TOKENS"] < 0:
        raise ConfigError(f"side-max-tokens must be >= 0 (0: no cap), got {cfg['SIDE_MAX_TOKENS']}")
    return cfg


def _engine_uid(user) -> int | None:
    """engine-user as a uid: a user name, or a number (which need not name a user)."""
    if user is None or user == "":
        return None
    if isinstance(user, int) or str(user).isdigit():
        return int(user)
    try:
        return pwd.getpwnam(str(user)).pw_uid
    except KeyError:
        raise ConfigError(f"engine-user {user!r} is not a user on this machine "
                          "(give the user kimi-engine runs as, by name or uid)") from None


def _check_names(cfg: dict) -> None:
    from proxy.clients import presets
    from proxy.toolcalls import PARSER_NAMES
    if cfg["TOOL_PARSER"] != "auto" and cfg["TOOL_PARSER"] not in PARSER_NAMES:
        raise ConfigError(f"tool-parser must be auto or one of {', '.join(PARSER_NAMES)}, "
                          f"got {cfg['TOOL_PARSER']!r}")
    if cfg["CLIENT"] != "auto":
        try:
            presets.check_client_name(cfg["CLIENT"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _check_exposure(cfg: dict) -> None:
    """Off loopback a key is required: the Host check stops browsers, not a LAN client, which
    could otherwise drive the model and read every stored Response."""
    if not cfg["API_KEY"] and not is_loopback_address(str(cfg["HOST"])):
        raise ConfigError(f"host {cfg['HOST']!r} is not a loopback address and no api-key is set, "
                          "so anyone who can reach it could use the proxy: set a key "
                          "(KIMI_PROXY_API_KEY, or the api-key config key), or listen on "
                          "loopback with --host 127.0.0.1")


def is_loopback_address(host: str) -> bool:
    """A listen address that only this machine reaches: localhost, 127.0.0.0/8 or ::1."""
    host = host.strip()
    if host.lower() == "localhost":
        return True
    try:
        return ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host).is_loopback
    except ValueError:
        return False  # another name, or "" (every address)


@functools.lru_cache(maxsize=256)  # every request asks; ip_address() costs 10 us
def is_loopback_host(host_header: str) -> bool:
    host = host_header.strip()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":")[0]
    if host.lower() in ("localhost", ""):
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False
