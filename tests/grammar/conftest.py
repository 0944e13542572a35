"""Fixtures of the grammar tests: the default model's text side, and the model served in process."""

import llguidance as llg
import pytest

from engined.chat import load_text
from engined.grammar.compile import Compiler
from tests.support import bench
from tests.support.engine import load_default_model
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
    return load_default_model(tmp_path_factory)


@pytest.fixture(scope="package")
def served(smol):
    from tests.support.engine import InProcessEngine
    with InProcessEngine(smol.model, smol.tokenizer, smol.chat, max_context=2048) as engine:
        yield engine


@pytest.fixture(scope="package")
def apply_patch() -> dict:
    """Codex's freeform apply_patch tool, as a recorded Codex request carries it."""
    tool = bench.load("structured_set").apply_patch()
    if tool is None:
        pytest.skip("no recorded Codex request with apply_patch")
    return tool


def lark_accepts(compiler, definition: str, text: str) -> bool:
    """llguidance's Lark parser of the grammar as Codex wrote it."""
    matcher = llg.LLMatcher(compiler.ll, llg.LLMatcher.grammar_from_lark(definition), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(compiler.ll.tokenize_str(text)) and matcher.is_accepting()
