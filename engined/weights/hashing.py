"""File hashing shared by the artifact cache key (GGUF repack) and the INT4 manifest."""
import hashlib
import pathlib


def file_sha256(path: pathlib.Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks (models are GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
