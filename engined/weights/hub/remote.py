"""What a repository revision holds, as huggingface_hub reports it, and one verified download.

Every call goes through huggingface_hub, so its token, HF_ENDPOINT mirror, HF_HUB_OFFLINE and
hf-xet transfers apply as the user has them set. Large (LFS) files are checked against the
hub's sha256, small ones against their git blob id (the hub gives no sha256 for those)."""
import contextlib
import hashlib
import pathlib
from dataclasses import dataclass

from tqdm import tqdm

from engined.weights.hub.ids import HubId
from engined.weights.hashing import file_sha256
from engined.weights.shards import CheckpointError, Header

# Other formats of the same weights: never fetched (llama.cpp's and transformers' leftovers).
SKIP_SUFFIXES = (".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt", ".tflite")


class PullError(CheckpointError):
    """A pull cannot go on; the message names the repository or file and what to do."""


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # git blob sha1 (small files)


@dataclass(frozen=True)
class Revision:
    hub_id: HubId
    commit: str
    files: dict[str, RemoteFile]

    @property
    def shards(self) -> list[RemoteFile]:
        return [f for n, f in sorted(self.files.items()) if n.endswith(".safetensors")]

    @property
    def support(self) -> list[RemoteFile]:
        return [f for n, f in sorted(self.files.items())
                if not n.endswith((".safetensors",) + SKIP_SUFFIXES)]


# huggingface_hub.errors class -> what a PullError says; the first match wins (subclasses first)
HUB_MESSAGES = (
    ("GatedRepoError", "{repo} is gated: accept its terms on the hub, then set HF_TOKEN or run "
                       "`hf auth login`"),
    ("RepositoryNotFoundError", "{repo}: no such repository at {endpoint} (or it is private and "
                                "no token with access is set)"),
    ("RevisionNotFoundError", "{repo}: no revision {revision!r}"),
    ("LocalEntryNotFoundError", "{id}: not in the Hugging Face cache {cache}, and HF_HUB_OFFLINE "
                                "is set (or the hub cannot be reached)"),
    ("OfflineModeIsEnabled", "{id}: HF_HUB_OFFLINE is set, so nothing can be downloaded; unset "
                             "it to pull"),
)


@contextlib.contextmanager
def hub_errors(hub_id: HubId):
    """huggingface_hub's and the transport's errors as one PullError line."""
    import httpx2
    from huggingface_hub import errors

    try:
        yield
    except Exception as exc:
        for name, message in HUB_MESSAGES:
            if isinstance(exc, getattr(errors, name)):
                raise PullError(message.format(repo=hub_id.repo, id=hub_id, revision=hub_id.revision,
                                               endpoint=endpoint(), cache=hf_cache())) from None
        if isinstance(exc, (errors.HfHubHTTPError, httpx2.HTTPError, errors.NotASafetensorsRepoError,
                            errors.SafetensorsParsingError)):
            raise PullError(f"{hub_id}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        raise


def hf_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def is_offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()


def resolve(hub_id: HubId) -> Revision:
    from huggingface_hub import HfApi

    with hub_errors(hub_id):
        info = HfApi().model_info(hub_id.repo, revision=hub_id.revision, files_metadata=True)
    files = {s.rfilename: RemoteFile(s.rfilename, s.lfs.size if s.lfs else (s.size or 0),
                                     s.lfs.sha256 if s.lfs else None, s.blob_id)
             for s in info.siblings or []}
    return Revision(hub_id, info.sha, files)


def shard_headers(rev: Revision) -> dict[str, Header]:
    """Every shard's safetensors header, read from the hub with Range requests (no weights)."""
    from huggingface_hub import HfApi

    with hub_errors(rev.hub_id):
        meta = HfApi().get_safetensors_metadata(rev.hub_id.repo, revision=rev.commit)
    return {name: Header(dict(fm.metadata), {t: (i.dtype, tuple(i.shape)) for t, i in fm.tensors.items()},
                         {t: tuple(i.data_offsets) for t, i in fm.tensors.items()})
            for name, fm in meta.files_metadata.items()}


def download(rev: Revision, remote: RemoteFile, local_dir: pathlib.Path, bar: tqdm) -> pathlib.Path:
    """One file into local_dir (resumed from a partial download there), checked against the
    hub's hash; a file that fails the check is deleted and named in the error."""
    from huggingface_hub import hf_hub_download

    start = bar.n
    with hub_errors(rev.hub_id):
        path = pathlib.Path(hf_hub_download(rev.hub_id.repo, remote.name, revision=rev.commit,
                                            local_dir=local_dir, tqdm_class=_forward_to(bar)))
    bar.update(start + remote.size - bar.n)  # a file already there moved no bytes
    got, want = _digest(path, remote)
    if got != want:
        path.unlink()
        kind = "sha256" if remote.sha256 else "git blob id"
        raise PullError(f"{remote.name}: {kind} {got} differs from the hub's {want} (corrupt "
                        "transfer or mirror); it was deleted, run the pull again")
    return path


def _digest(path: pathlib.Path, remote: RemoteFile) -> tuple[str | None, str | None]:
    if remote.sha256:
        return file_sha256(path), remote.sha256
    if remote.blob_id:
        blob = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
        blob.update(path.read_bytes())
        return blob.hexdigest(), remote.blob_id
    return None, None


def _forward_to(parent: tqdm):
    """A tqdm class for huggingface_hub whose bytes go to our one bar for the whole pull."""
    class Forward(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})
            parent.update(kwargs.get("initial", 0))  # bytes a resumed download already had

        def update(self, n=1):
            parent.update(n)

        # With these, an hf-xet download feeds one bar with the bytes written to disk and its
        # network bytes (fewer: dedup, compression) are not counted a second time.
        def update_transfer(self, n=1):
            pass

        def set_transfer_postfix_str(self, *args, **kwargs):
            pass

    return Forward


def snapshot(hub_id: HubId) -> pathlib.Path:
    """The whole revision in huggingface_hub's own cache (what `quantize ORG/REPO DST` reads);
    with HF_HUB_OFFLINE, the cached snapshot or a PullError."""
    from huggingface_hub import snapshot_download

    with hub_errors(hub_id):
        return pathlib.Path(snapshot_download(hub_id.repo, revision=hub_id.revision,
                                              ignore_patterns=[f"*{s}" for s in SKIP_SUFFIXES]))
