"""`serve --model ORG/REPO`: a repository not pulled yet is pulled first (same phases), then
served, and the tokens it serves are the oracle's (the reference forward on the hand-quantized
weights); after the pull, HF_HUB_OFFLINE=1 serves from the cache; under the systemd unit's
environment an uncached id is refused with the pull command, and nothing is downloaded."""
import json

import torch
from safetensors.torch import load_file

from tests.hub.conftest import REPO, ROOT, hub_env
from tests.support.engine import Daemon, post
from tests.weights import kimi_reference
from tests.weights.test_kimi_quantize import hand_dequantized
from engined.weights.quant_policy import policy

CHAT = {"model": "anything", "temperature": 0, "max_tokens": 6, "return_token_ids": True,
        "messages": [{"role": "user", "content": "hello there"}]}


def oracle_tokens(src, prompt: list[int], count: int) -> list[int]:
    """Greedy ids of the reference forward on the source weights, INT4 linears replaced by
    the hand-written quantizer's s * c (tests/weights/test_kimi_quantize.py)."""
    weights = {n: t for f in sorted(src.glob("*.safetensors")) for n, t in load_file(str(f)).items()}
    weights = {n: hand_dequantized(t, 32) if policy(n, "selective") == "int4" else t.float()
               for n, t in weights.items()}
    cfg = json.loads((src / "config.json").read_text())
    ids = list(prompt)
    for _ in range(count):
        ids.append(int(kimi_reference.forward(weights, cfg, torch.tensor(ids))[-1].argmax()))
    return ids[len(prompt):]


def _served(daemon: Daemon) -> dict:
    reply = post(daemon.sock, "/v1/chat/completions", CHAT)
    assert reply.status == 200, reply.text
    return reply.json()


def test_serve_pulls_an_uncached_id_then_serves_the_oracle_tokens_offline(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    daemon = Daemon(tmp_path / "cache", "--model", REPO, "--max-context", "256", env=env).start()
    try:
        first = _served(daemon)
    finally:
        assert daemon.stop() == 0
    log = daemon.stderr()
    assert f"{REPO}: not in the cache" in log and "quantized (selective)" in log
    assert f"pull {REPO}: 100%" in log
    gets = len(hub.requests)
    offline = Daemon(tmp_path / "cache", "--model", REPO, "--max-context", "256",
                     env=dict(env, HF_HUB_OFFLINE="1")).start()
    try:
        again = _served(offline)
    finally:
        assert offline.stop() == 0
    assert len(hub.requests) == gets and "cached artifact" in offline.stderr()
    assert first["model"] == REPO
    ids = first["choices"][0]["token_ids"]
    assert again["choices"][0]["token_ids"] == ids
    assert ids == oracle_tokens(hub.source, first["prompt_token_ids"], len(ids))


def _unit_environment() -> dict:
    text = (ROOT / "systemd" / "kimi-engine.service").read_text()
    lines = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("Environment=")]
    return dict(word.split("=", 1) for line in lines for word in line.split())


def test_the_unit_refuses_an_uncached_id_with_the_pull_command(hub, tmp_path):
    unit_env = _unit_environment()
    assert unit_env.get("HF_HUB_OFFLINE") == "1"
    cache = tmp_path / "var-cache-kimi"
    env = hub_env(hub, tmp_path, HF_HUB_OFFLINE=unit_env["HF_HUB_OFFLINE"],
                  CACHE_DIRECTORY=str(cache))
    gets = len(hub.requests)
    daemon = Daemon(tmp_path / "cache", "--model", REPO, env=env)
    daemon.env["CACHE_DIRECTORY"] = str(cache)  # systemd's CacheDirectory=
    daemon.start(wait=False)
    assert daemon.proc.wait(timeout=120) == 1
    assert f"env CACHE_DIRECTORY={cache} kimi-engine pull {REPO}" in daemon.stderr()
    assert len(hub.requests) == gets
