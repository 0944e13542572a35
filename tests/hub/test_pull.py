"""`kimi-engine pull` against a local hub (real huggingface_hub, HF_ENDPOINT): progress, a
second pull that does nothing, sha256 refusal and resume, disk checks and peak disk, new
revisions, `models` / `models rm`, published INT4 artifacts, HF_HUB_OFFLINE."""
import json
import shutil
import signal
import subprocess
import sys

import pytest

from tests.hub.conftest import REPO, artifact_dirs, hub_env, kimi
from tests.support import kimi_tiny
from tests.support.hub_server import HubServer
from tests.weights.test_kimi_quantize import assert_artifact_hand_quantized

SHARDS = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]


def _probe(env, *args) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.support.pull_probe", *args], env=env,
                         text=True, capture_output=True, timeout=300, cwd=env["PYTHONPATH"])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_pull_shows_progress_quantizes_and_a_second_pull_does_nothing(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    first = kimi(env, "pull", REPO)
    assert first.returncode == 0, first.stderr
    assert f"pull {REPO}: 100%" in first.stderr and "B/s" in first.stderr  # bytes, rate
    assert "sha256 verified" in first.stderr and "quantized (selective)" in first.stderr
    (artifact,) = artifact_dirs(tmp_path)
    assert artifact.name == hub.commit and str(artifact) in first.stdout
    assert kimi(env, "verify", str(artifact)).returncode == 0
    assert assert_artifact_hand_quantized(hub.source, artifact, 32) == 99  # quantize's plan
    assert not list(artifact.parent.glob("*.source"))  # BF16 deleted
    gets = len(hub.requests)
    again = kimi(env, "pull", REPO)
    assert again.returncode == 0 and "already pulled" in again.stderr
    assert [r for r in hub.requests[gets:] if r[1] in SHARDS] == []
    listed = kimi(env, "models")
    assert listed.returncode == 0
    assert f"{REPO}@{hub.commit[:12]}  main  plan selective" in listed.stdout
    assert f"quantized from {hub.url}/{REPO}" in listed.stdout


def test_sha256_mismatch_is_refused_naming_the_file_and_the_next_pull_resumes(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    hub.corrupt.add(SHARDS[2])
    try:
        bad = kimi(env, "pull", REPO)
    finally:
        hub.corrupt.discard(SHARDS[2])
    assert bad.returncode == 1
    assert f"{SHARDS[2]}: sha256" in bad.stderr and "differs from the hub's" in bad.stderr
    assert artifact_dirs(tmp_path) == []
    gets = len(hub.requests)
    good = kimi(env, "pull", REPO)
    assert good.returncode == 0, good.stderr
    assert good.stderr.count("quantized by an earlier pull, kept") == 2
    assert [f for m, f, r in hub.requests[gets:] if m == "GET" and f in SHARDS and r is None] \
        == [SHARDS[2]]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A repo whose first shard is over 20 MiB: huggingface_hub writes in 10 MiB blocks, so
    only such a shard shows a resume that starts past zero."""
    src = kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("wide") / "bf16", num_shards=3,
                                          hidden_size=6144)
    assert (src / SHARDS[0]).stat().st_size > 20 * 2**20
    with HubServer() as hub:
        hub.push_dir(REPO, src)
        yield hub


def test_a_transfer_cut_half_way_resumes_with_a_range_request(wide, tmp_path):
    env = hub_env(wide, tmp_path)
    wide.cut.add(SHARDS[0])
    pulled = kimi(env, "pull", REPO, "--quiet")
    assert pulled.returncode == 0, pulled.stderr
    assert wide.served_bytes(SHARDS[0])[-2:] == [None, f"bytes={10 * 2**20}-"]  # after headers
    assert kimi(env, "verify", str(artifact_dirs(tmp_path)[0])).returncode == 0


def test_an_interrupted_pull_keeps_the_shards_it_quantized(hub, tmp_path):
    """Ctrl-C in the middle of the second shard: the next pull takes the first shard's INT4 as
    it is and fetches only the rest (huggingface_hub 2.x keeps no partial file of the shard
    in flight, so that one starts over)."""
    env = hub_env(hub, tmp_path)
    hub.stall.add(SHARDS[1])
    hub.stalled.clear()
    hub.release.clear()
    # SIGINT at its default in the child, whatever this run inherited: a suite started in the
    # background of a non-interactive shell ignores SIGINT, and Python then never raises
    # KeyboardInterrupt.
    first = subprocess.Popen([sys.executable, "-m", "engined", "pull", REPO], env=env,
                             cwd=env["PYTHONPATH"], stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert hub.stalled.wait(120), "the transfer never reached the stall"
        first.send_signal(signal.SIGINT)
        assert first.wait(60) != 0
    finally:
        hub.release.set()
        if first.poll() is None:
            first.kill()
    assert f"{SHARDS[0]}: quantized (selective)" in first.stderr.read()
    assert artifact_dirs(tmp_path) == []
    gets = len(hub.requests)
    again = kimi(env, "pull", REPO)
    assert again.returncode == 0, again.stderr
    assert f"{SHARDS[0]}: quantized by an earlier pull, kept" in again.stderr
    fetched = [f for m, f, r in hub.requests[gets:] if m == "GET" and f in SHARDS and r is None]
    assert fetched == SHARDS[1:]
    assert kimi(env, "verify", str(artifact_dirs(tmp_path)[0])).returncode == 0


def test_a_repository_that_is_not_kimi_linear_is_refused_before_any_shard(hub, tmp_path):
    other = tmp_path / "llama"
    shutil.copytree(hub.source, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    hub.push_dir("someone/Llama", other)
    gets = len(hub.requests)
    refused = kimi(hub_env(hub, tmp_path), "pull", "someone/Llama")
    assert refused.returncode == 1 and "model_type 'llama' is not kimi_linear" in refused.stderr
    assert [r for r in hub.requests[gets:] if r[1] in SHARDS] == []


def test_disk_space_is_checked_first_and_says_what_it_needs(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    gets = len(hub.requests)
    result = _probe(env, REPO, "1000")
    assert result["error"].startswith(f"{REPO}: needs ")
    assert "one BF16 shard" in result["error"] and "has 1000 B" in result["error"]
    assert [r for r in hub.requests[gets:] if r[0] == "GET" and r[1] in SHARDS and r[2] is None] == []


def test_peak_disk_is_at_most_the_artifact_plus_one_shard(hub, tmp_path):
    result = _probe(hub_env(hub, tmp_path), REPO)
    (artifact,) = artifact_dirs(tmp_path)
    size = sum(p.stat().st_size for p in artifact.iterdir())
    largest = max((hub.source / s).stat().st_size for s in SHARDS)
    assert size < result["peak"] <= size + largest, result["phases"]


def test_keep_source_keeps_the_bf16_and_models_says_where(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    assert kimi(env, "pull", REPO, "--keep-source", "--quiet").returncode == 0
    (artifact,) = artifact_dirs(tmp_path)
    kept = artifact.with_name(artifact.name + ".source")
    assert all((kept / s).read_bytes() == (hub.source / s).read_bytes() for s in SHARDS)
    assert f"BF16 kept in {kept}" in kimi(env, "models").stdout


def test_a_new_revision_quantizes_anew_and_rm_removes(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    assert kimi(env, "pull", REPO, "--quiet").returncode == 0
    changed = tmp_path / "v2"
    shutil.copytree(hub.source, changed)
    kimi_tiny.write_tiny_checkpoint(changed, seed=7, num_shards=3)
    second = hub.push_dir(REPO, changed)
    try:
        pulled = kimi(env, "pull", REPO)
        assert pulled.returncode == 0 and "quantized (selective)" in pulled.stderr
        assert [p.name for p in artifact_dirs(tmp_path)] == sorted([hub.commit, second])
        listed = kimi(env, "models").stdout
        assert f"{REPO}@{second[:12]}  main  " in listed and f"{REPO}@{hub.commit[:12]}  -  " in listed
        gone = kimi(env, "models", "rm", f"{REPO}@{hub.commit[:12]}")
        assert gone.returncode == 0 and hub.commit[:12] in gone.stdout
        assert [p.name for p in artifact_dirs(tmp_path)] == [second]
        assert kimi(env, "models", "rm", REPO).returncode == 0
        assert artifact_dirs(tmp_path) == []
        assert kimi(env, "models", "rm", REPO).returncode == 1
    finally:
        hub.repos[REPO].refs["main"] = hub.commit


def test_a_published_int4_artifact_is_verified_not_quantized_again(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    published = tmp_path / "published"
    assert kimi(env, "quantize", str(hub.source), str(published), "--quiet").returncode == 0
    commit = hub.push_dir("someone/Kimi-Tiny-INT4", published)
    pulled = kimi(env, "pull", "someone/Kimi-Tiny-INT4")
    assert pulled.returncode == 0, pulled.stderr
    assert "not quantized again" in pulled.stderr and "quantized (" not in pulled.stderr
    (artifact,) = artifact_dirs(tmp_path)
    assert artifact.name == commit
    assert all((artifact / f.name).read_bytes() == f.read_bytes() for f in published.iterdir())
    assert "published INT4 from" in kimi(env, "models").stdout


def test_offline_pull_reports_the_cache_or_fails_clearly(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    offline = dict(env, HF_HUB_OFFLINE="1")
    missing = kimi(offline, "pull", REPO)
    assert missing.returncode == 1 and f"run: kimi-engine pull {REPO}" in missing.stderr
    assert kimi(env, "pull", REPO, "--quiet").returncode == 0
    gets = len(hub.requests)
    held = kimi(offline, "pull", REPO)
    assert held.returncode == 0 and hub.commit[:12] in held.stdout
    assert len(hub.requests) == gets


def test_quantize_takes_a_model_id_through_the_hf_cache(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    done = kimi(env, "quantize", REPO, str(tmp_path / "int4"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert assert_artifact_hand_quantized(hub.source, tmp_path / "int4", 32) == 99
    gets = len(hub.requests)
    offline = kimi(dict(env, HF_HUB_OFFLINE="1"), "quantize", REPO, str(tmp_path / "again"), "--quiet")
    assert offline.returncode == 0, offline.stderr
    assert len(hub.requests) == gets
    missing = kimi(dict(env, HF_HUB_OFFLINE="1"), "quantize", "org/absent", str(tmp_path / "x"))
    assert missing.returncode == 1 and "org/absent" in missing.stderr


def test_a_pull_with_the_hub_unreachable_reports_what_the_cache_holds(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    assert kimi(env, "pull", REPO, "--quiet").returncode == 0
    gone = dict(env, HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens on the discard port
    held = kimi(gone, "pull", REPO)
    assert held.returncode == 0 and hub.commit[:12] in held.stdout
    assert "the cache holds" in held.stderr
    missing = kimi(gone, "pull", "org/absent")
    assert missing.returncode == 1 and "org/absent" in missing.stderr
