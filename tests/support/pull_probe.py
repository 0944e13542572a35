"""`python -m tests.support.pull_probe ORG/REPO [FREE_BYTES]`: one pull in a fresh process (so
HF_ENDPOINT reaches huggingface_hub), measuring the engine cache's bytes on disk at every
phase the pull logs. FREE_BYTES stands in for statvfs's free space. Prints one JSON line:
{"peak": bytes, "phases": [[line, bytes], ...]} or {"error": message}."""
import json
import sys

from engined.weights.hub import ids, pull, store
from engined.weights.shards import CheckpointError


def on_disk() -> int:
    return sum(p.stat().st_size for p in store.root().rglob("*") if p.is_file())


def main(spec: str, free: str | None = None):
    if free is not None:
        pull.disk_free = lambda path: int(free)
    phases = []
    try:
        pull.pull(ids.parse(spec), progress=False, log=lambda line: phases.append([line, on_disk()]))
    except CheckpointError as exc:
        print(json.dumps({"error": str(exc)}))
        return
    print(json.dumps({"peak": max(b for _, b in phases), "phases": phases}))


if __name__ == "__main__":
    main(*sys.argv[1:])
