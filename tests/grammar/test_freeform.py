"""Codex's freeform apply_patch tool: its Lark grammar becomes the pattern of the `input` string
(proxy/dialects/freeform.py), and patches are judged by llguidance's own Lark parser of the raw
definition, independent of that conversion."""
import re

import pytest

from proxy.app import create_app
from proxy.dialects.freeform import input_schema, lark_to_regex
from tests.grammar.conftest import lark_accepts
from tests.support.proxy_fakes import proxy_config

GOOD = ["*** Begin Patch\n*** Update File: a.py\n@@ def f():\n-    return 1\n+    return 2\n*** End Patch\n",
        "*** Begin Patch\n*** Add File: notes.txt\n+hello\n+world\n*** End Patch",
        "*** Begin Patch\n*** Delete File: old.py\n*** Update File: b.py\n*** Move to: c.py\n*** End Patch\n"]
MALFORMED = ["*** Begin Patch\n*** Update File: a.py\n-x\n",                 # no end
             "*** Begin Patch\n*** End Patch\n",                                # no hunk
             "Begin Patch\n*** Add File: x\n+y\n*** End Patch\n",               # no stars
             "*** Begin Patch\n*** Add File: x\nno plus sign\n*** End Patch\n",  # add line without +
             "*** Begin Patch\n*** Update File: a.py\n@@\n*x\n*** End Patch\n"]  # bad change line


@pytest.mark.parametrize("text", GOOD + MALFORMED)
def test_the_regex_agrees_with_the_grammars_own_parser(apply_patch, compiler, text):
    definition = apply_patch["format"]["definition"]
    expected = text in GOOD
    assert lark_accepts(compiler, definition, text) is expected
    assert bool(re.fullmatch(lark_to_regex(definition), text)) is expected


@pytest.mark.parametrize("definition", [
    'start: "(" start ")" | "x"',                   # recursive: not regular
    "start: x",                                     # undefined rule
    'start: WORD\n%import common.WORD\n%ignore " "',  # %ignore changes what matches
])
def test_a_grammar_a_regex_cannot_say_keeps_the_plain_string(definition):
    assert input_schema({"type": "grammar", "syntax": "lark", "definition": definition}) is None


def test_a_regex_format_is_used_as_it_is():
    schema = input_schema({"type": "grammar", "syntax": "regex", "definition": "[a-z]+"})
    assert schema == {"type": "string", "pattern": "^(?:[a-z]+)$"}


def test_codex_apply_patch_call_is_constrained_through_the_proxy(served, apply_patch, compiler, tmp_path):
    client = create_app(proxy_config(f"unix://{served.sock}", tmp_path)).test_client()
    resp = client.post("/v1/responses", json={
        "model": "m", "input": "Add a file hello.txt that says hi.", "tools": [apply_patch],
        "tool_choice": "required", "max_output_tokens": 160, "temperature": 0})
    assert resp.status_code == 200, resp.get_data()
    calls = [item for item in resp.get_json()["output"] if item["type"] == "custom_tool_call"]
    assert calls and calls[0]["name"] == "apply_patch"
    assert lark_accepts(compiler, apply_patch["format"]["definition"], calls[0]["input"])


def test_a_chat_custom_tool_call_is_constrained_through_the_proxy(served, apply_patch, compiler, tmp_path):
    """The same tool in the Chat API's shape ({"type": "custom", "custom": {...}}, the grammar
    under format.grammar), named by tool_choice."""
    fmt = apply_patch["format"]
    tool = {"type": "custom", "custom": {
        "name": "apply_patch", "description": apply_patch["description"],
        "format": {"type": "grammar", "grammar": {"syntax": fmt["syntax"], "definition": fmt["definition"]}}}}
    client = create_app(proxy_config(f"unix://{served.sock}", tmp_path)).test_client()
    resp = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "Add a file hello.txt that says hi."}],
        "tools": [tool], "tool_choice": {"type": "custom", "custom": {"name": "apply_patch"}},
        "max_tokens": 160, "temperature": 0})
    assert resp.status_code == 200, resp.get_data()
    calls = resp.get_json()["choices"][0]["message"]["tool_calls"]
    assert calls[0]["type"] == "custom" and calls[0]["custom"]["name"] == "apply_patch"
    assert lark_accepts(compiler, fmt["definition"], calls[0]["custom"]["input"])
