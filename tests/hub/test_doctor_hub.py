"""doctor for a model id: whether the cache holds it and its verify status, the disk a pull
needs against what is free, RAM against the plan's CPU part, and the hub settings (the
endpoint in use; whether a token is set, never its value)."""
from tests.hub.conftest import REPO, hub_env, kimi


def checks(result) -> dict[str, str]:
    out, name = {}, None
    for line in result.stdout.splitlines():
        if line.startswith("    ") and name:
            out[name] += "\n" + line
            continue
        name = line[3:].split(":", 1)[0]
        out[name] = line
    return out


def test_doctor_before_and_after_a_pull(hub, tmp_path):
    env = hub_env(hub, tmp_path, HF_TOKEN="hf_secret_value_42")
    before = kimi(env, "doctor", "--model", REPO, "--socket", str(tmp_path / "s.sock"))
    lines = checks(before)
    assert before.returncode == 1 and "hf_secret_value_42" not in before.stdout + before.stderr
    assert lines["model"].startswith(f"x  model: {REPO}: not in the cache")
    assert f"fix: run kimi-engine pull {REPO}" in lines["model"]
    assert "disk: the pull needs" in lines["disk"] and "one BF16 shard" in lines["disk"]
    assert lines["disk"].startswith("ok ")
    assert lines["hub"] == (f"ok hub: endpoint {hub.url} (HF_ENDPOINT), token set (HF_TOKEN), "
                            "HF_HUB_OFFLINE off")
    assert kimi(env, "pull", REPO, "--quiet").returncode == 0
    after = kimi(dict(env, HF_HUB_OFFLINE="1"), "doctor", "--model", REPO, "--socket",
                 str(tmp_path / "s.sock"), "--device", "cpu")
    lines = checks(after)
    assert lines["model"].startswith(f"ok model: {REPO}: pulled, commit {hub.commit[:12]}, "
                                     "plan selective, quantized, verified ")
    assert f"{REPO} is pulled" in lines["disk"] and lines["disk"].startswith("ok ")
    assert "in RAM (weights and KV cache in RAM)" in lines["memory plan"]
    assert lines["memory plan"].startswith("ok ")
    assert "HF_HUB_OFFLINE on: nothing is downloaded" in lines["hub"]
    assert after.returncode == 0, after.stdout
