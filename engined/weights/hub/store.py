"""The engine's model cache: what `pull` made, by repository and commit.

    $CACHE/models/ORG--REPO/refs/REVISION        the commit a revision resolved to (one line)
    $CACHE/models/ORG--REPO/COMMIT/              the INT4 artifact (kimi-int4.json manifest)
    $CACHE/models/ORG--REPO/COMMIT.origin.json   where it came from and how it was made
    $CACHE/models/ORG--REPO/COMMIT.partial/      an artifact being written (never served)
    $CACHE/models/ORG--REPO/COMMIT.source/       BF16 files being downloaded, or kept
    $CACHE/models/ORG--REPO/COMMIT.lock          held (flock) while a pull of COMMIT runs

$CACHE is config.cache_dir(). An artifact counts as held once its origin record exists: the
record is written last, after the artifact directory is complete and verified."""
import contextlib
import fcntl
import json
import os
import pathlib
import pwd
import shutil
from dataclasses import dataclass

from engined.config import cache_dir
from engined.weights.hub.ids import HubId, is_commit
from engined.weights.shards import CheckpointError

ORIGIN = ".origin.json"


class NotPulled(CheckpointError):
    """The id is not in the engine's cache and this start may not download it."""


@dataclass(frozen=True)
class Entry:
    repo: str
    commit: str
    path: pathlib.Path  # the artifact directory
    origin: dict

    @property
    def revisions(self) -> list[str]:
        """The branches and tags that resolve to this commit now (a moved branch drops it)."""
        refs = self.path.parent / "refs"
        return sorted(r.name.replace("%2F", "/") for r in refs.glob("*")
                      if r.read_text().strip() == self.commit)

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    @property
    def id(self) -> str:
        return f"{self.repo}@{self.commit[:12]}"


def root(env=os.environ) -> pathlib.Path:
    return cache_dir(env) / "models"


def repo_dir(repo: str, env=os.environ) -> pathlib.Path:
    return root(env) / repo.replace("/", "--")


def _ref_file(hub_id: HubId, env) -> pathlib.Path:
    return repo_dir(hub_id.repo, env) / "refs" / hub_id.revision.replace("/", "%2F")


def find(hub_id: HubId, env=os.environ) -> Entry | None:
    """The held artifact of the id's revision (a commit, or the commit its ref last named)."""
    commit = hub_id.revision if is_commit(hub_id.revision) else None
    if commit is None:
        ref = _ref_file(hub_id, env)
        commit = ref.read_text().strip() if ref.is_file() else None
    if commit is None:
        return None
    return _entry(repo_dir(hub_id.repo, env), hub_id.repo, commit)


def _entry(directory: pathlib.Path, repo: str, commit: str) -> Entry | None:
    origin = directory / (commit + ORIGIN)
    if not (origin.is_file() and (directory / commit).is_dir()):
        return None
    return Entry(repo, commit, directory / commit, json.loads(origin.read_text()))


def entries(env=os.environ) -> list[Entry]:
    found = []
    for origin in sorted(root(env).glob("*/*" + ORIGIN)):
        record = json.loads(origin.read_text())
        entry = _entry(origin.parent, record["repo"], origin.name.removesuffix(ORIGIN))
        if entry is not None:
            found.append(entry)
    return found


def work_dirs(hub_id: HubId, commit: str, env=os.environ) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """(artifact, partial artifact, source staging) directories of one commit."""
    base = repo_dir(hub_id.repo, env)
    return base / commit, base / (commit + ".partial"), base / (commit + ".source")


@contextlib.contextmanager
def pull_lock(hub_id: HubId, commit: str, env=os.environ):
    """One pull of a commit at a time: a second one (another shell, a serve) is refused."""
    base = repo_dir(hub_id.repo, env)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / (commit + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(f"{hub_id}: another kimi-engine pull of commit {commit[:12]} "
                                  "is running; wait for it") from None
        yield


def record(hub_id: HubId, commit: str, origin: dict, env=os.environ) -> Entry:
    """Mark the complete artifact of `commit` as held, and point the id's revision at it."""
    base = repo_dir(hub_id.repo, env)
    path = base / (commit + ORIGIN)
    old = json.loads(path.read_text()) if path.is_file() else {}
    revisions = sorted(set(old.get("revisions", [])) | {hub_id.revision})
    path.write_text(json.dumps({**old, **origin, "repo": hub_id.repo, "commit": commit,
                                "revisions": revisions}, indent=1, sort_keys=True))
    point(hub_id, commit, env)
    return _entry(base, hub_id.repo, commit)


def point(hub_id: HubId, commit: str, env=os.environ):
    if not is_commit(hub_id.revision):
        ref = _ref_file(hub_id, env)
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit + "\n")


def remove(spec: str, env=os.environ) -> list[Entry]:
    """Delete what `spec` names: ORG/REPO (every commit), ORG/REPO@REVISION or an `models` ID
    (ORG/REPO@COMMIT-PREFIX). Returns the entries removed."""
    repo, _, rev = spec.partition("@")
    held = [e for e in entries(env) if e.repo == repo]
    if rev:
        ref = _ref_file(HubId(repo, rev), env)
        target = ref.read_text().strip() if ref.is_file() else rev
        held = [e for e in held if e.commit.startswith(target)]
    for entry in held:
        base = entry.path.parent
        for refs in (base / "refs").glob("*"):
            if refs.read_text().strip() == entry.commit:
                refs.unlink()
        for suffix in ("", ".partial", ".source"):
            shutil.rmtree(base / (entry.commit + suffix), ignore_errors=True)
        (base / (entry.commit + ORIGIN)).unlink()
        (base / (entry.commit + ".lock")).unlink(missing_ok=True)
    return held


def pull_hint(hub_id: HubId, env=os.environ) -> str:
    """The command that fills this cache; under systemd's CacheDirectory, as the unit's user."""
    systemd = env.get("CACHE_DIRECTORY", "").split(":")[0]
    if not systemd:
        return hub_id.pull_command()
    user = pwd.getpwuid(os.geteuid()).pw_name
    return f"sudo -u {user} env CACHE_DIRECTORY={systemd} {hub_id.pull_command()}"


def require(hub_id: HubId, env=os.environ) -> Entry:
    """The held artifact, or NotPulled naming the command to run."""
    entry = find(hub_id, env)
    if entry is None:
        raise NotPulled(f"model {hub_id} is not in the cache {root(env)} (nor a local path); "
                        f"run: {pull_hint(hub_id, env)}")
    return entry
