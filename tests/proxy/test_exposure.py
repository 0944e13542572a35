"""Who can reach the proxy and read its key (issue 25, items 2 and 3): a listen address off
loopback needs an API key, refused at start otherwise; a key given as a flag is visible to
every local user, and the log says so."""
import os
import socket
import subprocess
import sys

import pytest

from proxy import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.20", "kimi.lan", "fe80::1"])
def test_a_non_loopback_host_without_a_key_is_refused(host):
    with pytest.raises(config.ConfigError) as caught:
        config.load({"HOST": host}, environ={})
    message = str(caught.value)
    assert f"host {host!r} is not a loopback address" in message
    assert "KIMI_PROXY_API_KEY" in message and "api-key" in message
    assert "--host 127.0.0.1" in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost", "LOCALHOST",
                                  "[::1]"])
def test_loopback_needs_no_key(host):
    assert config.load({"HOST": host}, environ={})["HOST"] == host


def test_a_key_from_any_layer_allows_any_host(tmp_path):
    assert config.load({"HOST": "0.0.0.0", "API_KEY": "k"}, environ={})["HOST"] == "0.0.0.0"
    env = {"KIMI_PROXY_HOST": "0.0.0.0", "KIMI_PROXY_API_KEY": "k"}
    assert config.load({}, environ=env)["API_KEY"] == "k"
    toml = tmp_path / "proxy.toml"
    toml.write_text('host = "0.0.0.0"\napi-key = "k"\n')
    assert config.load({}, str(toml), environ={})["HOST"] == "0.0.0.0"


def run_serve(*args, tmp_path, env=None, timeout=30):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KIMI_PROXY_")},
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "run"),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "proxy", "serve", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_serve_on_all_addresses_without_a_key_exits_1_with_one_line(tmp_path):
    result = run_serve("--host", "0.0.0.0", "--port", "9", tmp_path=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kimi-proxy: host '0.0.0.0' is not a loopback"), lines


def test_a_key_on_the_command_line_is_warned_about(tmp_path):
    """Started on a port that is taken, so each run stops right after its start-up lines."""
    warning = "--api-key on the command line is visible to every local user"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        flag = run_serve("--api-key", "s3cret", "--port", port, tmp_path=tmp_path)
        env = run_serve("--port", port, tmp_path=tmp_path, env={"KIMI_PROXY_API_KEY": "s3cret"})
    assert flag.returncode == env.returncode == 1, flag.stderr + env.stderr
    assert warning in flag.stderr and "KIMI_PROXY_API_KEY" in flag.stderr
    assert "s3cret" not in flag.stderr
    assert "cannot listen" in env.stderr and warning not in env.stderr
