"""A local hub with tiny real-format Kimi-Linear repositories, and the environment that points
the real huggingface_hub at it (HF_ENDPOINT) with private HF and engine caches."""
import os
import pathlib
import subprocess
import sys

import pytest

from tests.support import kimi_tiny
from tests.support.hub_server import HubServer

REPO = "moonshotai/Kimi-Tiny"
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    src = kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("hub") / "bf16", num_shards=3)
    with HubServer() as server:
        server.source = src
        server.commit = server.push_dir(REPO, src)
        yield server


def hub_env(hub: HubServer, root: pathlib.Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING", "KIMI_ENGINE_")) and k != "CACHE_DIRECTORY"}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(root / "hf"), XDG_CACHE_HOME=str(root / "cache"),
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT), **extra)
    return env


def kimi(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engined", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, cwd=ROOT)


def artifact_dirs(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in (root / "cache" / "kimi" / "models").glob("*/*")
                  if p.is_dir() and len(p.name) == 40)
