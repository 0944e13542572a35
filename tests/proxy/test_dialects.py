"""Every dialect module offers the same interface (proxy/dialects/__init__.py), and none
imports another dialect."""
import ast
import pathlib

import pytest

from proxy.dialects import anthropic, openai_chat, openai_responses

API = ("NAME", "TURN_ID_PREFIX", "INPUT_FIELD", "INTERLEAVED_CALLS", "parse_request", "prepare", "complete",
       "render_response", "stream", "render_error", "stream_error")
DIALECTS = {"anthropic": ("anthropic", "anthropic_out"), "openai_chat": ("openai_chat",),
            "openai_responses": ("openai_responses", "responses_out", "responses_state", "responses_compact")}


@pytest.mark.parametrize("dialect", [anthropic, openai_chat, openai_responses])
def test_each_dialect_has_the_whole_interface(dialect):
    assert [name for name in API if name not in vars(dialect)] == []


def test_no_dialect_imports_another():
    folder = pathlib.Path(anthropic.__file__).parent
    owner = {module: name for name, modules in DIALECTS.items() for module in modules}
    for path in folder.glob("*.py"):
        mine = owner.get(path.stem)
        nodes = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom) and n.module]
        imported = {n.module.rsplit(".", 1)[-1] for n in nodes if n.module.startswith("proxy.dialects.")}
        imported |= {a.name for n in nodes if n.module == "proxy.dialects" for a in n.names}
        assert {owner[m] for m in imported if m in owner} <= {mine}, path.name
