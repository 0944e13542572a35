"""A pull interrupted after some shards resumes by adopting them: only a whole shard written
with the same plan and group size is taken; anything else is written anew. And one pull of a
commit at a time."""
import fcntl

from engined.weights.kimi_checkpoint import open_checkpoint
from engined.weights.quantize import ArtifactWriter, plan_tensors
from tests.hub.conftest import REPO, hub_env, kimi
from tests.support import kimi_tiny


def _writer(dst, ckpt, plan="selective", group=32):
    return ArtifactWriter(dst, plan, group, plan_tensors(ckpt.headers, plan, group), resume=True)


def test_adopt_takes_only_a_whole_shard_of_the_same_plan_and_group(tmp_path):
    ckpt = open_checkpoint(kimi_tiny.write_tiny_checkpoint(tmp_path / "bf16", num_shards=2))
    first, second = ckpt.shards
    dst = tmp_path / "artifact"
    _writer(dst, ckpt).add_shard(first, None)
    header = ckpt.headers[first]
    assert _writer(dst, ckpt).adopt(first.name, header)
    assert not _writer(dst, ckpt, group=16).adopt(first.name, header)
    assert not _writer(dst, ckpt, plan="none").adopt(first.name, header)
    assert not _writer(dst, ckpt).adopt(second.name, ckpt.headers[second])  # never written
    written = dst.with_name("artifact.partial") / first.name
    written.write_bytes(written.read_bytes()[:-1])  # cut short by a crash
    assert not _writer(dst, ckpt).adopt(first.name, header)


def test_a_second_pull_of_the_same_commit_at_once_is_refused(hub, tmp_path):
    env = hub_env(hub, tmp_path)
    base = tmp_path / "cache" / "kimi" / "models" / REPO.replace("/", "--")
    base.mkdir(parents=True)
    with open(base / (hub.commit + ".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        refused = kimi(env, "pull", REPO, "--quiet")
    assert refused.returncode == 1 and "another kimi-engine pull" in refused.stderr
    assert kimi(env, "pull", REPO, "--quiet").returncode == 0
