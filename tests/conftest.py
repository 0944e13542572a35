"""Shared fixtures. Tests talk only to loopback or Unix sockets and never download anything."""
import pathlib
import sys

import pytest

from engined.weights.default_model import default_gguf_path

try:  # numpy advises MADV_HUGEPAGE on each array of 4 MiB or more; one carved from glibc's
    # [heap] leaves that range advised after it is freed, and torch tensors later placed there
    # get 2 MiB pages in THP `madvise` mode: the plain model that
    # tests/weights/test_hugepages.py holds to 4 KiB pages then failed, now and then, in a
    # worker whose earlier tests had made such arrays. Here the weights' arena is the only advice.
    import numpy
    numpy._core.multiarray._set_madvise_hugepage(False)
except (ImportError, AttributeError):
    pass

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def pytest_collection_finish(session):
    """No test module may leave bench/ on sys.path: a module there can shadow a package a
    library imports (bench/kernels.py hid transformers' `kernels` until it was renamed),
    failing unrelated tests later in the session (tests/support/bench.py loads by path)."""
    bench = str(ROOT / "bench")
    if any(str(pathlib.Path(p).resolve()) == bench for p in sys.path if p):
        raise pytest.UsageError("bench/ is on sys.path after collection: load bench scripts "
                                "with tests.support.bench.load")


@pytest.fixture(scope="session")
def default_gguf() -> pathlib.Path:
    return default_gguf_path()


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present (it sits beside the repository in CI)")
    return SHARED


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory) -> pathlib.Path:
    """One XDG cache for the session's engine daemons, holding the default model's artifact
    (tests/support/default_artifact.py): no daemon repacks it."""
    from tests.support import default_artifact
    return default_artifact.seed(tmp_path_factory.getbasetemp() / "engine-cache", tmp_path_factory)


@pytest.fixture
def kimi_cache(tmp_path, monkeypatch) -> pathlib.Path:
    """A private XDG cache so tests never share or pollute the user's repacked models."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    return cache


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """A tiny real-format Kimi-Linear checkpoint, written and loaded once per test module
    (tests change its state and latent pools, so modules do not share one)."""
    from engined.weights.kimi_checkpoint import load_kimi_linear
    from tests.support import kimi_tiny
    return load_kimi_linear(kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "t"),
                            progress=False).model


_DESELECTED: dict[str, int] = {}


def pytest_deselected(items):
    for item in items:
        for marker in ("gpu", "realclient", "slow"):
            if item.get_closest_marker(marker):
                _DESELECTED[marker] = _DESELECTED.get(marker, 0) + 1


def pytest_sessionfinish(session):
    """An xdist worker hands its count to the controller, which prints the summary."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["deselected"] = dict(_DESELECTED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller collects nothing itself: each worker deselects the same tests."""
    for marker, count in getattr(node, "workeroutput", {}).get("deselected", {}).items():
        _DESELECTED[marker] = max(_DESELECTED.get(marker, 0), count)


def pytest_terminal_summary(terminalreporter):
    """Say what the marker filter left out, and how to run it."""
    how = {"gpu": "needs a CUDA device", "realclient": "make test-clients",
           "slow": "pytest -m slow"}
    for marker, count in sorted(_DESELECTED.items()):
        terminalreporter.write_line(f"deselected: {count} test(s) marked {marker} ({how[marker]})")
