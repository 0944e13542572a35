"""`ORG/REPO[@REVISION]`: how a model spec names a Hugging Face repository.

A spec that is an existing path stays a path, so a local directory `org/repo` is never
mistaken for a repository. The revision defaults to `main`."""
import pathlib
import re
from dataclasses import dataclass

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_ID = re.compile(rf"({_NAME})/({_NAME})(?:@([A-Za-z0-9][A-Za-z0-9._/-]{{0,254}}))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class HubId:
    repo: str  # ORG/REPO
    revision: str = DEFAULT_REVISION  # a branch, a tag or a commit

    def __str__(self) -> str:
        return self.repo if self.revision == DEFAULT_REVISION else f"{self.repo}@{self.revision}"

    @property
    def is_commit(self) -> bool:
        return bool(_COMMIT.fullmatch(self.revision))

    def pull_command(self) -> str:
        return f"kimi-engine pull {self}"


def parse(spec: str) -> HubId | None:
    """The HubId a model spec names, or None for a path, `default` or `synthetic:`."""
    match = _ID.fullmatch(spec.strip())
    if not match or spec.startswith((".", "~")) or pathlib.Path(spec).expanduser().exists():
        return None
    org, name, revision = match.groups()
    if ".." in (org, name) or name.endswith(".gguf"):
        return None
    return HubId(f"{org}/{name}", revision or DEFAULT_REVISION)


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.fullmatch(revision))
