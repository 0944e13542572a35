"""Fixtures of the in-process engine tests."""

import pytest

from tests.support.engine import load_default_model


@pytest.fixture(scope="package")
def llama(tmp_path_factory):
    """The default model (SmolLM2 repacked to INT4), loaded once for tests/engine/."""
    return load_default_model(tmp_path_factory)
