"""Fixtures of the grammar tests: the default model's text side, and the model served in process."""
import os

import pytest

from engined.chat import load_text
from engined.grammar.compile import Compiler
from engined.weights import loader
from engined.weights.default_model import default_gguf_path


@pytest.fixture(scope="package")
def smol_text():
    """(tokenizer, chat format) of the default model (SmolLM2)."""
    return load_text(default_gguf_path())


@pytest.fixture(scope="package")
def compiler(smol_text):
    tokenizer, chat = smol_text
    return Compiler(tokenizer, chat.stop_token_ids, log=lambda line: None)


@pytest.fixture(scope="package")
def smol(tmp_path_factory):
    """The default model (SmolLM2 repacked to INT4), loaded once for tests/grammar/."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mp.delenv("CACHE_DIRECTORY", raising=False)
        return loader.load_model("default", threads=min(2, os.cpu_count() or 1), progress=False)


@pytest.fixture(scope="package")
def served(smol):
    from tests.support.engine import InProcessEngine
    with InProcessEngine(smol.model, smol.tokenizer, smol.chat, max_context=2048) as engine:
        yield engine
