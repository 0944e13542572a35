from gevent import monkey; monkey.patch_all()  # noqa: E702,I001 - must run before anything else imports socket

"""`kimi-proxy`: serve, replay, doctor."""
import logging  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import click  # noqa: E402

from proxy import __version__  # noqa: E402
from proxy import config as config_mod  # noqa: E402

log = logging.getLogger("kimi.proxy")


def _options(f):
    opts = [
        click.option("--upstream", help="unix:///PATH or http(s)://HOST:PORT/v1 (default: the engine socket)"),
        click.option("--host", help="address to listen on (default 127.0.0.1; any other needs an API key)"),
        click.option("--port", type=int, help="port to listen on (default 8080)"),
        click.option("--client", help="pin a client preset for its own dialect (default auto)"),
        click.option("--reasoning-field", help="auto|reasoning_content|reasoning|inline|none"),
        click.option("--tool-parser", help="auto or a parser name"),
        click.option("--model", help="model name sent upstream"),
        click.option("--model-alias", multiple=True, help="A=B: send B when the client asks for A"),
        click.option("--ledger", help="SQLite ledger path (mode 0600)"),
        click.option("--api-key", help="require this key on every route but /health "
                                        "(others can read it here: prefer KIMI_PROXY_API_KEY)"),
        click.option("--log-file", help="append the request log here"),
        click.option("--record", help="write cassettes into this directory"),
        click.option("--config", "config_path", help="TOML config file"),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _config_or_exit(config_path, flags: dict, prefix: str, err: bool = False) -> dict:
    """The layered config (flags of None: not given), or its error on one line and exit 1."""
    try:
        return config_mod.load({config_mod.key_of(k): v for k, v in flags.items()}, config_path)
    except config_mod.ConfigError as exc:
        click.echo(f"{prefix}{exc}", err=err)
        sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kimi-proxy")
def main():
    """Serve Claude Code, Codex and OpenAI-Chat agents from one local model."""


@main.command()
@_options
def serve(config_path, **flags):
    """Run the proxy."""
    cfg = _config_or_exit(config_path, flags, "kimi-proxy: ", err=True)
    _setup_logging(cfg["LOG_FILE"])
    if flags.get("api_key"):
        log.warning("--api-key on the command line is visible to every local user (ps, "
                    "/proc/*/cmdline); set KIMI_PROXY_API_KEY instead, for the service in a "
                    "mode 0600 EnvironmentFile (/etc/kimi/proxy.env)")
    from proxy.server import serve_forever
    sys.exit(serve_forever(cfg))


class _Formatter(logging.Formatter):
    """asctime's strftime once a second, not once a line: the same text, 6 us less a request."""
    _second, _text = None, ""

    def formatTime(self, record, datefmt=None):
        if datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second, self._text = second, time.strftime(self.default_time_format, self.converter(second))
        return self.default_msec_format % (self._text, record.msecs)


def _setup_logging(path):
    # The lines name no thread, process or source line: skip finding them (the Logging
    # HOWTO's "Optimization"; 5 us of the request log line).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger("kimi")
    root.setLevel(logging.INFO)
    fmt = _Formatter("%(asctime)s %(levelname)s %(message)s")

    def attach():
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
        handler.setFormatter(fmt)
        root.addHandler(handler)

    attach()
    if path:  # in a greenlet of its own, so never in the middle of another greenlet's write
        import gevent
        gevent.signal_handler(signal.SIGHUP, attach)


@main.command()
@click.argument("cassettes", nargs=-1, required=True)
@click.option("-v", "--verbose", is_flag=True, help="print every difference")
@click.option("--allowlist", help="JSON file of explained differences per cassette")
def replay(cassettes, verbose, allowlist):
    """Re-run cassettes through the translation and print the differences."""
    from proxy.cassettes.replay import replay_paths
    sys.exit(replay_paths(cassettes, verbose=verbose, echo=click.echo, allowlist=allowlist))


@main.command()
@_options
def doctor(config_path, **flags):
    """Check the configuration, the upstream and the port."""
    cfg = _config_or_exit(config_path, flags, "x config: ")
    click.echo("ok config")
    from proxy.upstream.client import Upstream
    is_ok, detail = Upstream(cfg["UPSTREAM"], timeout_s=5, engine_uid=cfg["ENGINE_USER"]).health()
    click.echo(f"{'ok' if is_ok else 'x'} upstream {cfg['UPSTREAM']}: {detail}"
               + ("" if is_ok else "  (start kimi-engine, or pass --upstream)"))
    is_ok = _check_ledger(cfg["LEDGER"]) and is_ok
    with socket.socket() as s:
        try:
            s.bind((cfg["HOST"], cfg["PORT"]))
            click.echo(f"ok port {cfg['HOST']}:{cfg['PORT']} is free")
        except OSError as exc:
            click.echo(f"x port {cfg['HOST']}:{cfg['PORT']}: {exc.strerror} (pick another with --port)")
            is_ok = False
    sys.exit(0 if is_ok else 1)


def _check_ledger(path: str) -> bool:
    """Open (creating) the ledger; a missing StateDirectory= is systemd's to create at start."""
    import os
    import pathlib
    state_dir = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    parent = pathlib.Path(path).parent
    if state_dir and parent == pathlib.Path(state_dir) and not parent.exists():
        click.echo(f"ok ledger {path}: {parent} is created by systemd (StateDirectory=) at start")
        return True
    try:
        from proxy.state.store import Database
        Database(path).close()
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure as one line
        click.echo(f"x ledger {path}: {exc} (pass --ledger PATH in a writable directory)")
        return False
    click.echo(f"ok ledger {path}")
    return True


if __name__ == "__main__":
    main()
