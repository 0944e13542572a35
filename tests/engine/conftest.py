"""Fixtures of the in-process engine tests."""
import os

import pytest

from engined.weights import loader


@pytest.fixture(scope="package")
def llama(tmp_path_factory):
    """The default model (SmolLM2 repacked to INT4), loaded once for tests/engine/."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mp.delenv("CACHE_DIRECTORY", raising=False)
        return loader.load_model("default", threads=min(2, os.cpu_count() or 1), progress=False)
