"""systemd units, sysusers, logrotate and man pages: what a packaged service start relies on."""
import configparser
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
MAN_PAGES = ["kimi-engine.8", "kimi-proxy.8", "kimi-local.conf.5"]


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # directive names are case-sensitive
    parser.read_string((ROOT / "systemd" / name).read_text())
    return parser


def test_engine_unit_directives():
    service = unit("kimi-engine.service")["Service"]
    assert service["Type"] == "notify"
    assert service["User"] == service["Group"] == "kimi"
    assert service["RuntimeDirectory"] == "kimi"
    assert service["RuntimeDirectoryPreserve"] == "yes"
    for key in ("StateDirectory", "LogsDirectory", "CacheDirectory"):
        assert service[key] == "kimi"
        assert service[key + "Mode"] == "0700"  # the proxy, in group kimi, stays out
    assert service["RuntimeDirectoryMode"] == "0750" and service["UMask"] == "0027"
    assert "TRITON_CACHE_DIR=/var/cache/kimi/" in service["Environment"]
    assert service["EnvironmentFile"] == "-/etc/kimi/engine.env"
    assert service["ExecStart"].startswith("@BINDIR@/kimi-engine serve --config /etc/kimi/engine.toml")
    assert service["Restart"] == "on-failure"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert service[key] == "yes"
    assert service["ProtectSystem"] == "strict"
    text = (ROOT / "systemd" / "kimi-engine.service").read_text()
    assert "DeviceAllow=/dev/nvidiactl rw" in text and "SupplementaryGroups=" in text
    assert service["RestrictAddressFamilies"] == "AF_UNIX AF_NETLINK"  # no IP: a Unix socket only
    # CUDA and Triton JIT into writable-executable memory, and read /proc/driver/nvidia.
    assert "MemoryDenyWriteExecute" not in service and "ProcSubset" not in service
    assert "PrivateDevices" not in service and service["DevicePolicy"] == "closed"


def test_proxy_unit_directives():
    parsed = unit("kimi-proxy.service")
    assert parsed["Unit"]["Requires"] == parsed["Unit"]["After"] == "kimi-engine.service"
    service = parsed["Service"]
    assert service["Type"] == "notify"
    # A user of its own, in group kimi for the socket, trusting the engine's user kimi.
    assert (service["User"], service["Group"], service["SupplementaryGroups"]) == \
        ("kimi-proxy", "kimi-proxy", "kimi")
    assert service["Environment"] == "KIMI_PROXY_ENGINE_USER=kimi"
    assert "RuntimeDirectory" not in service  # the engine's unit owns /run/kimi
    assert service["StateDirectory"] == service["LogsDirectory"] == "kimi-proxy"
    assert service["ExecStart"] == ("@BINDIR@/kimi-proxy serve --config /etc/kimi/proxy.toml "
                                    "--log-file /var/log/kimi-proxy/proxy.log")
    assert service["MemoryDenyWriteExecute"] == service["PrivateDevices"] == "yes"
    proxy_conf = (ROOT / "etc" / "proxy.toml").read_text()
    assert 'upstream = "unix:///run/kimi/engine.sock"' in proxy_conf


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_verify(tmp_path):
    for name in ("kimi-engine.service", "kimi-proxy.service"):
        text = (ROOT / "systemd" / name).read_text().replace("@BINDIR@", str(BIN))
        (tmp_path / name).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no",
                             str(tmp_path / "kimi-engine.service"),
                             str(tmp_path / "kimi-proxy.service")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "kimi-" not in result.stderr, result.stderr


EXPOSURE_LIMITS = {"kimi-engine.service": 3.0, "kimi-proxy.service": 2.0}  # issue 25 item 6


def test_units_exposure(tmp_path):
    """systemd-analyze's exposure score of each unit as shipped, offline (no running systemd)."""
    if shutil.which("systemd-analyze") is None:
        print("SKIP reason: systemd-analyze is not installed (apt-get install systemd)")
        pytest.skip("systemd-analyze is not installed")
    for name, limit in EXPOSURE_LIMITS.items():
        path = tmp_path / name
        path.write_text((ROOT / "systemd" / name).read_text().replace("@BINDIR@", str(BIN)))
        result = subprocess.run(["systemd-analyze", "security", "--offline=true", str(path)],
                                capture_output=True, text=True, timeout=60)
        match = re.search(rf"Overall exposure level for {re.escape(name)}: (\d+\.\d+)", result.stdout)
        assert match, result.stdout[-2000:] + result.stderr
        print(f"{name}: exposure {match.group(1)} (limit {limit})")
        assert float(match.group(1)) <= limit, result.stdout


def test_sysusers_and_logrotate():
    sysusers = (ROOT / "systemd" / "kimi.sysusers").read_text()
    for line in ("u kimi ", "u kimi-proxy ", "m kimi-proxy kimi\n"):
        assert re.search(rf"^{line}", sysusers, re.M), line
    rotate = (ROOT / "systemd" / "kimi-local.logrotate").read_text()
    assert rotate.startswith("/var/log/kimi/*.log /var/log/kimi-proxy/*.log {")
    for word in ("daily", "compress", "delaycompress", "postrotate"):
        assert re.search(rf"^\s+{word}$", rotate, re.M), word
    assert "reload kimi-engine.service kimi-proxy.service" in rotate


@pytest.mark.parametrize("page", MAN_PAGES)
def test_man_page_lint(page):
    result = subprocess.run(["groff", "-ww", "-z", "-man", str(ROOT / "man" / page)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def cli_options(command: list[str]) -> set[str]:
    out = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", out.stdout)) - {"--help"}


def man_options(page: str) -> set[str]:
    roff = (ROOT / "man" / page).read_text().replace("\\-", "-")
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", roff))


@pytest.mark.parametrize("command,page", [
    (["kimi-engine"], "kimi-engine.8"),
    (["kimi-engine", "serve"], "kimi-engine.8"),
    (["kimi-proxy"], "kimi-proxy.8"),
    (["kimi-proxy", "serve"], "kimi-proxy.8"),
    (["kimi-proxy", "doctor"], "kimi-proxy.8"),  # serve's options, documented once
])
def test_every_cli_option_is_in_its_man_page(command, page):
    exe = [str(BIN / command[0])] + command[1:]
    missing = cli_options(exe) - man_options(page)
    assert not missing, f"{' '.join(command)} options missing from man/{page}: {sorted(missing)}"


def conf5_keys() -> set[str]:
    conf5 = (ROOT / "man" / "kimi-local.conf.5").read_text().replace("\\-", "-")
    return set(re.findall(r"^\.BR ([a-z][a-z0-9-]*) ", conf5, re.M))


def test_every_config_key_is_in_conf5():
    for command in (["kimi-engine", "serve"], ["kimi-proxy", "serve"]):
        keys = {o[2:] for o in cli_options([str(BIN / command[0])] + command[1:])}
        keys -= {"config", "version"}
        missing = keys - conf5_keys()
        assert not missing, f"{command[0]} keys missing from kimi-local.conf(5): {sorted(missing)}"


def test_config_only_keys_are_in_conf5_once():
    """Keys the config layers accept, flag or not: every one documented, and only once."""
    import dataclasses

    from engined.config import EngineConfig
    from proxy.config import DEFAULTS

    engine = {f.name.replace("_", "-") for f in dataclasses.fields(EngineConfig)}
    proxy = {k.lower().replace("_", "-") for k in DEFAULTS}
    assert {"allow-origin", "small-model", "ledger-ttl-s"} <= proxy
    conf5 = (ROOT / "man" / "kimi-local.conf.5").read_text().replace("\\-", "-")
    engine_part, proxy_part = conf5.split(".SH PROXY KEYS")
    for keys, part in ((engine, engine_part), (proxy, proxy_part)):
        listed = re.findall(r"^\.BR ([a-z][a-z0-9-]*) ", part, re.M)
        assert not keys - set(listed), sorted(keys - set(listed))
        assert sorted(k for k in listed if listed.count(k) > 1) == []


def command_entries(page: str) -> dict[str, str]:
    """The COMMANDS section's top-level entries (name -> text, nested .RS lists included)."""
    roff = (ROOT / "man" / page).read_text().replace("\\-", "-")
    section = roff.split(".SH COMMANDS\n", 1)[1].split("\n.SH ", 1)[0]
    entries, name, depth, lines = {}, None, 0, section.splitlines()
    for i, line in enumerate(lines):
        depth += (line == ".RS") - (line == ".RE")
        match = re.match(r"\.B ([a-z]+)", line)
        if depth == 0 and match and i and lines[i - 1] == ".TP":
            name = match.group(1)
            entries[name] = ""
        if name:
            entries[name] += line + "\n"
    return entries


@pytest.mark.parametrize("command,page", [
    (["kimi-engine", "doctor"], "kimi-engine.8"),
    (["kimi-engine", "quantize"], "kimi-engine.8"),
    (["kimi-engine", "verify"], "kimi-engine.8"),
    (["kimi-engine", "bench"], "kimi-engine.8"),
    (["kimi-engine", "pull"], "kimi-engine.8"),
    (["kimi-proxy", "replay"], "kimi-proxy.8"),
])
def test_subcommand_options_are_in_their_man_entry(command, page):
    entry = command_entries(page).get(command[1])
    assert entry, f"man/{page} has no COMMANDS entry for {command[1]}"
    options = cli_options([str(BIN / command[0])] + command[1:])
    documented = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", entry))
    missing = options - documented
    assert not missing, f"{' '.join(command)} options missing from its entry in man/{page}: {sorted(missing)}"


def test_every_subcommand_is_in_the_synopsis_and_commands():
    for exe, page in (("kimi-engine", "kimi-engine.8"), ("kimi-proxy", "kimi-proxy.8")):
        out = subprocess.run([str(BIN / exe), "--help"], capture_output=True, text=True, timeout=120)
        names = set(re.findall(r"^  ([a-z]+)  ", out.stdout.split("Commands:")[1], re.M))
        assert names >= {"serve", "doctor"}, out.stdout
        roff = (ROOT / "man" / page).read_text()
        synopsis = roff.split(".SH SYNOPSIS")[1].split(".SH ")[0]
        assert {n for n in names if f".B {exe} {n}" not in synopsis} == set(), page
        assert names - set(command_entries(page)) == set(), page


def test_example_configs_show_every_key_and_load_uncommented(tmp_path):
    import dataclasses

    from engined.config import EngineConfig, read_toml
    from proxy import config as proxy_config

    for name, keys in (("engine.toml", [f.name for f in dataclasses.fields(EngineConfig)]),
                       ("proxy.toml", list(proxy_config.DEFAULTS))):
        text = (ROOT / "etc" / name).read_text()
        shown = set(re.findall(r"^#? ?([a-z][a-z0-9-]*) = ", text, re.M))
        missing = {k.lower().replace("_", "-") for k in keys} - shown
        assert not missing, f"etc/{name} has no example for {sorted(missing)}"
        uncommented = re.sub(r"^# ([a-z-]+ = .*?)([ \t]+#.*)?$", r"\1", text, flags=re.M)
        # engine-user must name a user: kimi exists where the package is installed.
        uncommented = uncommented.replace('engine-user = "kimi"', 'engine-user = "root"')
        (tmp_path / name).write_text(uncommented)
    assert read_toml(tmp_path / "engine.toml")["prefix_cache_bytes"] == "256MiB"
    EngineConfig.layered({}, {}, tmp_path / "engine.toml")
    assert proxy_config.load({}, str(tmp_path / "proxy.toml"), {})["DRAIN_TIMEOUT_S"] == 25.0
