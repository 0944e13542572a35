"""EngineConfig: sizes, the socket-path rule, layering and validation."""
import os
import stat

import pytest

from engined.config import (ConfigError, EngineConfig, default_socket_path, ensure_socket_dir,
                            parse_size)


@pytest.mark.parametrize("text,expected", [
    ("600MB", 600_000_000), ("2GiB", 2 * 1024**3), ("2G", 2 * 1024**3), ("1234", 1234),
    (4096, 4096), ("1.5KiB", 1536), (" 10 kb ", 10_000), ("0", 0)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "12XB", "-5MB", "", True, "1e9"])
def test_parse_size_rejects(bad):
    with pytest.raises(ConfigError, match="expected a size"):
        parse_size(bad)


def test_socket_path_rule():
    assert str(default_socket_path({"RUNTIME_DIRECTORY": "/run/kimi", "XDG_RUNTIME_DIR": "/x"})
               ) == "/run/kimi/engine.sock"
    assert str(default_socket_path({"XDG_RUNTIME_DIR": "/run/user/7"})
               ) == "/run/user/7/kimi/engine.sock"
    assert str(default_socket_path({})) == f"/tmp/kimi-{os.getuid()}/engine.sock"


def test_socket_dirs_are_created_private(tmp_path):
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "a" / "b" / "engine.sock"
    ensure_socket_dir(path)
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755  # existing parents are left alone


def test_layering_precedence(tmp_path):
    config_file = tmp_path / "engine.toml"
    config_file.write_text('max-context = 100\nthreads = 3\ndevice = "cpu"\n')
    env = {"KIMI_ENGINE_MAX_CONTEXT": "200", "KIMI_ENGINE_THREADS": "4"}
    flags = {"max_context": 300, "threads": None, "device": None}
    config = EngineConfig.layered(flags, env, config_file)
    assert (config.max_context, config.threads, config.device) == (300, 4, "cpu")
    assert EngineConfig.layered({}, {}, None) == EngineConfig()


def test_config_validation_messages():
    with pytest.raises(ConfigError, match="device: expected one of auto, cpu, cuda"):
        EngineConfig(device="tpu")
    with pytest.raises(ConfigError, match="threads: expected a whole number"):
        EngineConfig(threads="many")
    assert EngineConfig(memory_cap="1KiB").memory_cap == 1024



def test_moe_cache_is_a_size_or_auto():
    from engined.config import MOE_CACHE_AUTO
    assert EngineConfig().moe_cache == MOE_CACHE_AUTO
    assert EngineConfig(moe_cache="512MiB").moe_cache == 512 * 2**20
    assert EngineConfig(moe_cache=0).moe_cache == 0
    assert EngineConfig.layered({}, {"KIMI_ENGINE_MOE_CACHE": "auto"}).moe_cache == MOE_CACHE_AUTO
    assert EngineConfig.layered({"moe-cache": "1GiB"}, {}).moe_cache == 2**30
    with pytest.raises(ConfigError, match="moe-cache: expected a size"):
        EngineConfig(moe_cache="lots")


def test_the_prefill_chunk_is_the_devices_unless_given():
    """256 tokens on the CPU, 2048 on a GPU (kimi-engine(8) says why); 0 means the default."""
    assert [EngineConfig().prefill_chunk_on(d) for d in ("cpu", "cuda", "cuda:1")] == [256, 2048, 2048]
    assert [EngineConfig(prefill_chunk=128).prefill_chunk_on(d) for d in ("cpu", "cuda")] == [128, 128]
    assert EngineConfig.layered({}, {"KIMI_ENGINE_PREFILL_CHUNK": "0"}).prefill_chunk_on("cuda") == 2048
    with pytest.raises(ConfigError, match="prefill-chunk: expected 0..1048576"):
        EngineConfig(prefill_chunk=1 << 21)


def test_speculation_turns_off_from_the_command_line_or_the_config_file(tmp_path, monkeypatch):
    """`serve --speculative off`, `speculative = false` in the --config file (and its
    KIMI_ENGINE_ variable) reach the config the daemon builds its Engine from
    (Engine(speculative=config.speculative)); the flag wins over the file."""
    from click.testing import CliRunner
    from engined.__main__ import main
    from engined.serving import daemon
    served = []
    monkeypatch.setattr(daemon, "run", lambda config: served.append(config) or 0)
    monkeypatch.delenv("KIMI_ENGINE_SPECULATIVE", raising=False)
    off_file, on_file = tmp_path / "off.toml", tmp_path / "on.toml"
    off_file.write_text("speculative = false\n")
    on_file.write_text("speculative = true\n")
    for args in (["--speculative", "off"], ["--config", str(off_file)],
                 ["--config", str(on_file), "--speculative", "off"], [],
                 ["--config", str(off_file), "--speculative", "on"]):
        result = CliRunner().invoke(main, ["serve", *args])
        assert result.exit_code == 0, result.output
    assert [config.speculative for config in served] == [False, False, False, True, True]
    assert EngineConfig.layered({}, {}, off_file).speculative is False
    assert EngineConfig.layered({}, {"KIMI_ENGINE_SPECULATIVE": "off"}).speculative is False
    with pytest.raises(ConfigError, match="speculative: expected true or false"):
        EngineConfig(speculative="sometimes")
