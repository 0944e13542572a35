"""`kimi-engine pull ORG/REPO[@REVISION]`: a repository revision -> our INT4 artifact in the
engine's cache, one BF16 shard at a time.

    resolve the revision (commit, file list with sha256s) -> already held? done
    config.json is Kimi-Linear? -> every shard's header over Range requests -> plan (the same
    INT4 plan as `quantize`) -> free disk for the plan? -> support files -> for each shard:
    already in COMMIT.partial from an interrupted pull? keep it : download (huggingface_hub
    resumes a cut transfer with Range), verify sha256, quantize into COMMIT.partial, re-read
    its header, delete the BF16 shard -> index + manifest -> COMMIT/ and its origin record

Peak disk is the artifact plus one BF16 shard (all of the BF16 with keep_source). A repository
whose files are already our INT4 artifact (kimi-int4.json) is downloaded and verified as is."""
import datetime
import json
import os
import pathlib
import shutil
from dataclasses import dataclass

from tqdm import tqdm

from engined.config import format_size
from engined.weights.hub import remote, store
from engined.weights.hub.ids import HubId
from engined.weights.hub.remote import PullError, Revision
from engined.models.kimi_linear_config import ConfigError, parse_config
from engined.weights import kimi_checkpoint
from engined.weights.quantize import ArtifactWriter, check_settings, plan_tensors, planned_bytes
from engined.weights.shards import INDEX, MANIFEST


def disk_free(path: pathlib.Path) -> int:
    """Bytes free to this user on the filesystem of `path` (its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def pull(hub_id: HubId, keep_source: bool = False, plan: str = "selective", group_size: int = 32,
         progress: bool = True, log=print) -> store.Entry:
    """The held artifact of the id, pulled first when the cache lacks it."""
    check_settings(plan, group_size)
    if remote.is_offline():
        return store.require(hub_id)
    try:
        rev = remote.resolve(hub_id)
    except PullError as exc:  # the hub is unreachable, or the repo gone: what the cache holds
        held = store.find(hub_id)
        if held is None:
            raise
        log(f"{exc}; the cache holds {held.id}, pulled {held.origin.get('pulled_at')}")
        return held
    log(f"{hub_id}: revision {hub_id.revision} is commit {rev.commit} at {remote.endpoint()}")
    with store.pull_lock(hub_id, rev.commit):
        held = store.find(HubId(hub_id.repo, rev.commit))
        if held is not None:
            store.record(hub_id, rev.commit, {})
            log(f"{hub_id}: already pulled, {held.path}")
            return held
        if MANIFEST in rev.files:
            return _take_published(rev, progress, log)
        return _quantize_while_downloading(rev, keep_source, plan, group_size, progress, log)


def _origin(rev: Revision, kind: str, **extra) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"kind": kind, "endpoint": remote.endpoint(), "pulled_at": now, "verified": now, **extra}


def _check_disk(rev: Revision, need: int, what: str, log):
    where = store.repo_dir(rev.hub_id.repo)
    free = disk_free(where)
    if free < need:
        raise PullError(f"{rev.hub_id}: needs {format_size(need)} free in {where} ({what}), "
                        f"has {format_size(free)}; free some space or set XDG_CACHE_HOME to a "
                        "larger disk")
    log(f"{rev.hub_id}: disk: needs {format_size(need)} ({what}), {format_size(free)} free")


def _bar(rev: Revision, files, progress: bool) -> tqdm:
    return tqdm(total=sum(f.size for f in files), desc=f"pull {rev.hub_id.repo}", unit="B",
                unit_scale=True, unit_divisor=1024, disable=not progress)


def _take_published(rev: Revision, progress: bool, log) -> store.Entry:
    dst, partial, _ = store.work_dirs(rev.hub_id, rev.commit)
    files = rev.support + rev.shards
    _check_disk(rev, sum(f.size for f in files), "a published INT4 artifact, taken as is", log)
    partial.mkdir(parents=True, exist_ok=True)
    with _bar(rev, files, progress) as bar:
        for f in files:
            remote.download(rev, f, partial, bar)
    shutil.rmtree(partial / ".cache", ignore_errors=True)  # huggingface_hub's resume records
    ckpt = kimi_checkpoint.open_checkpoint(partial, rehash=True)  # manifest, headers, hashes
    if not ckpt.is_int4:
        raise PullError(f"{rev.hub_id}: has {MANIFEST} but its shards are not our INT4 format")
    partial.rename(dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    log(f"{rev.hub_id}: published INT4 artifact verified against {MANIFEST}, not quantized again")
    return store.record(rev.hub_id, rev.commit, _origin(
        rev, "published", plan=manifest.get("plan"), group_size=manifest.get("group_size")))


@dataclass(frozen=True)
class PullPlan:
    headers: dict  # shard name -> shards.Header, read over Range requests
    decisions: dict[str, str]  # tensor -> 'int4' | 'keep'
    need: int  # bytes of free disk the pull needs at its peak
    what: str  # how `need` is made up, for messages


def plan_pull(rev: Revision, keep_source: bool = False, plan: str = "selective",
              group_size: int = 32) -> PullPlan:
    """What a pull of a BF16 revision writes and keeps at most, from its shard headers alone
    (doctor reports it before any pull)."""
    headers = remote.shard_headers(rev)
    shards = [f for f in rev.shards if f.name in headers]
    decisions = plan_tensors(headers, plan, group_size)
    artifact = planned_bytes(headers, plan, group_size)
    bf16 = sum(f.size for f in shards)
    kept = bf16 if keep_source else max(f.size for f in shards)
    what = (f"artifact {format_size(artifact)} + " +
            (f"BF16 kept {format_size(bf16)}" if keep_source else
             f"one BF16 shard {format_size(kept)}, each deleted once quantized"))
    support = sum(f.size for f in rev.support)
    return PullPlan(headers, decisions, artifact + kept + 2 * support, what)


def _quantize_while_downloading(rev: Revision, keep_source: bool, plan: str, group_size: int,
                                progress: bool, log) -> store.Entry:
    dst, partial, source = store.work_dirs(rev.hub_id, rev.commit)
    _check_config(rev, source)
    planned = plan_pull(rev, keep_source, plan, group_size)
    headers = planned.headers
    shards = [f for f in rev.shards if f.name in headers]
    _check_disk(rev, planned.need, planned.what, log)
    writer = ArtifactWriter(dst, plan, group_size, planned.decisions, resume=True)
    with _bar(rev, rev.support + shards, progress) as bar:
        for f in rev.support:
            remote.download(rev, f, source, bar)
        writer.copy_support(source)
        if not keep_source:  # the artifact holds them now; the staging keeps only shards
            for f in rev.support:
                (source / f.name).unlink(missing_ok=True)
        for number, f in enumerate(shards, 1):
            step = f"{rev.hub_id}: shard {number}/{len(shards)} {f.name}"
            if writer.adopt(f.name, headers[f.name]):
                bar.update(f.size)
                log(f"{step}: quantized by an earlier pull, kept")
                continue
            path = remote.download(rev, f, source, bar)
            log(f"{step}: downloaded, sha256 verified")
            writer.add_shard(path, None)
            log(f"{step}: quantized ({plan}) and re-read")
            if not keep_source:
                path.unlink()
    manifest = writer.seal()
    size = sum(e["size"] for e in manifest["files"].values())
    log(f"{rev.hub_id}: artifact {dst} ({format_size(size)}, plan {plan})")
    if not keep_source:
        shutil.rmtree(source)
    return store.record(rev.hub_id, rev.commit, _origin(
        rev, "quantized", plan=plan, group_size=group_size,
        source=str(source) if keep_source else None))


def _check_config(rev: Revision, source: pathlib.Path):
    """Fail before any shard moves (config.json alone is fetched) when the repository is not
    a Kimi-Linear checkpoint."""
    if "config.json" not in rev.files:
        raise PullError(f"{rev.hub_id}: no config.json (not a transformers checkpoint)")
    source.mkdir(parents=True, exist_ok=True)
    with tqdm(disable=True) as quiet:
        path = remote.download(rev, rev.files["config.json"], source, quiet)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PullError(f"{rev.hub_id}: config.json is not JSON ({exc})") from None
    if raw.get("model_type") != "kimi_linear":
        raise PullError(f"{rev.hub_id}: model_type {raw.get('model_type')!r} is not kimi_linear "
                        "(pull takes Kimi-Linear checkpoints and our INT4 artifacts)")
    try:
        parse_config(raw)
    except ConfigError as exc:
        raise PullError(f"{rev.hub_id}: config.json: {exc}") from None
    if INDEX not in rev.files and len(rev.shards) > 1:
        raise PullError(f"{rev.hub_id}: several shards but no {INDEX}")


def ensure(hub_id: HubId, log, progress: bool = True) -> store.Entry:
    """What `serve --model ORG/REPO` does first: the held artifact, else a pull with the same
    progress and phases, unless HF_HUB_OFFLINE forbids downloading (the systemd unit sets it):
    then NotPulled names the pull command to run."""
    held = store.find(hub_id)
    if held is not None:
        log(f"{hub_id}: cached artifact {held.path} ({held.origin.get('kind')}, plan "
            f"{held.origin.get('plan')})")
        return held
    if remote.is_offline():
        return store.require(hub_id)
    log(f"{hub_id}: not in the cache {store.root()}; pulling it (kimi-engine pull does the same)")
    return pull(hub_id, progress=progress, log=log)
