"""Black-box: `kimi-engine quantize` then `kimi-engine serve --model DIR` on tiny Kimi-Linear
checkpoints (BF16 and our INT4 artifact), over the real Unix socket."""

import pytest

from tests.support import kimi_tiny  # noqa: E402
from tests.support.engine import Daemon, metric, post, run_cli, stream  # noqa: E402

CHAT = {"model": "anything", "temperature": 0, "max_tokens": 8,
        "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("kimi")
    bf16 = kimi_tiny.write_tiny_checkpoint(root / "bf16")
    int4 = root / "int4"
    result = run_cli("quantize", str(bf16), str(int4), "--quiet")
    assert result.returncode == 0, result.stderr
    verified = run_cli("verify", str(int4))
    assert verified.returncode == 0, verified.stderr
    return bf16, int4


@pytest.mark.parametrize("kind", ["bf16", "int4", "bf16-cpu-moe"])
def test_serves_tiny_checkpoint_over_socket(checkpoints, kind, tmp_path):
    """bf16-cpu-moe: a new user's --cpu-moe on the BF16 checkpoint and the CPU, the no-op
    that serve --help describes (issue 30 item 5)."""
    path = checkpoints[1] if kind == "int4" else checkpoints[0]
    flags = ("--cpu-moe",) if kind.endswith("cpu-moe") else ()
    daemon = Daemon(tmp_path / "cache", "--model", str(path), "--max-context", "256", *flags).start()
    try:
        whole = post(daemon.sock, "/v1/chat/completions", CHAT)
        assert whole.status == 200, whole.text()
        body = whole.json()
        assert body["usage"]["completion_tokens"] >= 1
        assert body["model"] != "anything"  # the loaded model's real id
        events = stream(daemon.sock, "/v1/chat/completions", dict(CHAT, stream=True))
        streamed = "".join(e["choices"][0]["delta"].get("content") or ""
                           for e in events if isinstance(e, dict) and e.get("choices"))
        assert streamed == (body["choices"][0]["message"]["content"] or "")
    finally:
        assert daemon.stop() == 0
    if flags:
        assert "BF16 routed experts, already in RAM; nothing changes" in daemon.stderr()


def test_tampered_artifact_is_refused_at_start(checkpoints, tmp_path):
    int4 = checkpoints[1]
    shard = sorted(int4.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    copy = tmp_path / "tampered"
    copy.mkdir()
    for f in int4.iterdir():
        (copy / f.name).write_bytes(bytes(data) if f == shard else f.read_bytes())
    daemon = Daemon(tmp_path / "cache", "--model", str(copy))
    with pytest.raises(RuntimeError, match="exited 1"):
        daemon.start()
    assert shard.name in daemon.stderr() or "sha256" in daemon.stderr().lower()


SCORED = dict(CHAT, max_tokens=12, logprobs=True, top_logprobs=2)


def _served(path, tmp_path, *placement):
    """Greedy tokens + logprobs of one request, and the daemon's offload counters and log."""
    daemon = Daemon(tmp_path / "cache", "--model", str(path), "--max-context", "256",
                    *placement).start()
    try:
        whole = post(daemon.sock, "/v1/chat/completions", SCORED)
        assert whole.status == 200, whole.text()
        content = whole.json()["choices"][0]["logprobs"]["content"]
        events = stream(daemon.sock, "/v1/chat/completions", dict(SCORED, stream=True))
        streamed = "".join(e["choices"][0]["delta"].get("content") or ""
                           for e in events if isinstance(e, dict) and e.get("choices"))
        assert streamed == "".join(c["token"] for c in content)
        calls = metric(daemon.sock, "kimi_engine_offload_moe_calls_total") if placement else None
        moved = (metric(daemon.sock, "kimi_engine_offload_bytes_total", 'direction="to_host"')
                 if placement else None)
    finally:
        assert daemon.stop() == 0
    return content, calls, moved, daemon.stderr()


def test_routed_experts_in_ram_serve_the_same_tokens(checkpoints, tmp_path):
    """Issue 17: the INT4 checkpoint served plain, with --cpu-moe (all three MoE layers
    experts through the hybrid step) and --n-cpu-moe 1: the same greedy tokens, logprobs
    within 1e-4, and the offload counters prove the hybrid path ran (on the CPU the device
    half runs through the same code and host buffers)."""
    plain, _, _, _ = _served(checkpoints[1], tmp_path / "plain")
    for flags, layers in ((("--cpu-moe",), 3), (("--n-cpu-moe", "1"), 1)):
        hybrid, calls, moved, log = _served(checkpoints[1], tmp_path / flags[-1], *flags)
        assert [c["token"] for c in hybrid] == [c["token"] for c in plain], flags
        assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(hybrid, plain)) <= 1e-4
        tokens = len(plain)
        assert calls >= 2 * layers * tokens  # every step of both requests, each offloaded layer
        assert moved > 0
        assert f"routed experts of {layers} of 3 MoE layers in RAM" in log, log


def test_an_impossible_placement_is_refused_before_loading(checkpoints, tmp_path):
    daemon = Daemon(tmp_path / "cache", "--model", str(checkpoints[1]), "--n-cpu-moe", "9")
    with pytest.raises(RuntimeError, match="exited 1"):
        daemon.start()
    assert "--n-cpu-moe 9: this model has 3 MoE layers" in daemon.stderr()
    assert "loading model" not in daemon.stderr()


def test_w4a8_experts_serve_and_a_bf16_checkpoint_refuses_them(checkpoints, tmp_path):
    """--moe-w4a8 on the INT4 artifact, alone and with the experts in RAM; on the BF16
    checkpoint (no INT4 experts) a clear refusal before loading."""
    plain, _, _, _ = _served(checkpoints[1], tmp_path / "plain")
    runs = []
    for flags in (("--moe-w4a8",), ("--moe-w4a8", "--cpu-moe")):
        content, _, _, log = _served(checkpoints[1], tmp_path / flags[-1], *flags)
        assert "the routed experts the CPU runs are W4A8 (--moe-w4a8)" in log
        # the same greedy tokens here, each logprob within 0.05 (measured: 0.024 at most)
        assert [c["token"] for c in content] == [c["token"] for c in plain], flags
        assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(content, plain)) <= 0.05
        assert content != plain                  # W4A8 ran: the numbers moved
        runs.append(content)
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(*runs)) <= 1e-4  # in RAM too
    daemon = Daemon(tmp_path / "cache", "--model", str(checkpoints[0]), "--moe-w4a8")
    with pytest.raises(RuntimeError, match="exited 1"):
        daemon.start()
    assert "--moe-w4a8: W4A8 routed experts need the INT4 artifact; this model has BF16" in daemon.stderr()
    assert "loading model" not in daemon.stderr()          # refused from the plan, first
