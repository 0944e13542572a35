"""The default model's repacked artifact, made once a test run and copied into the caches of the
fixtures that load the model (or start engines on it): each repack took ~3 s of a core, nine a
run. The repack itself is tested on empty caches (tests/weights/test_gguf_repack.py, the
`kimi_cache` fixture, the doctor's "repacked on first start"), never on a seeded one."""
import fcntl
import os
import pathlib
import shutil

import pytest

from engined.config import cache_dir
from engined.weights import gguf_repack
from engined.weights.default_model import default_gguf_path


def seed(cache_home: pathlib.Path, tmp_path_factory) -> pathlib.Path:
    """cache_home (an XDG_CACHE_HOME) gets the artifact, a copy (a test may damage its own);
    returns cache_home."""
    gguf = default_gguf_path()
    run = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run = run.parent  # the run's folder, above each worker's own
    with open(run / "default-artifact.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker repacks, the others wait for it
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_CACHE_HOME", str(run / "default-artifact"))
            mp.delenv("CACHE_DIRECTORY", raising=False)
            artifact = gguf_repack.cached_artifact(gguf, progress=False)
    target = cache_dir({"XDG_CACHE_HOME": str(cache_home)}) / artifact.relative_to(
        run / "default-artifact" / "kimi")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(artifact, target)
    return cache_home
