"""A request's output constraint -> the grammar its Sequence decodes under (HTTP thread).

- tool_choice required or a named function: the whole reply is the chat family's tool-call
  syntax (the chat format writes the grammar: `chat.tool_grammar`), arguments under each
  tool's schema; `auto` with tools: the same grammar, lazy (it wakes at the opener).
- else response_format / structured_outputs: a JSON schema, regex, choice or Lark grammar.
A source that does not compile is a 400 naming the field path that failed. A JSON reply (a
schema, a tool call) is closed in time when it loops or its max_tokens runs low
(grammar/loop_guard.py), with the literal tails of its schemas' patterns to close strings.
"""
from __future__ import annotations

import threading

from engined.errors import InvalidRequest
from engined.grammar.closing import closing_texts
from engined.grammar.compile import Compiler, GrammarError
from engined.grammar.matcher import GrammarMatcher
from engined.grammar.strict import closed
from engined.serving.parse import Constraint

_lock = threading.Lock()


def compiler_for(served) -> Compiler:
    """The loaded model's grammar compiler, built on first use (its token table: ~0.2 s)."""
    with _lock:
        if served.grammar_compiler is None:
            compiler = Compiler(served.tokenizer, served.chat.stop_token_ids, log=served.engine.log)
            compiler.on_compile = served.engine.metrics.grammar_compile.observe
            served.grammar_compiler = compiler
        return served.grammar_compiler


def request_grammar(served, constraint: Constraint | None, max_tokens: int,
                    tools: list[dict] | None = None, forced: str | None = None,
                    is_parallel: bool = True) -> GrammarMatcher | None:
    """max_tokens: the reply's, fitted to the context; forced: engined.chat.messages.forced_tool's
    answer ('*', a name, '' for auto, None)."""
    if tools and forced is not None and (forced or constraint is None):
        return _tool_matcher(served, tools, forced, is_parallel, max_tokens)
    if constraint is None:
        return None
    compiler = compiler_for(served)
    try:
        if constraint.kind == "json_schema":
            compiled = compiler.json_schema(constraint.source, constraint.where)
        elif constraint.kind == "regex":
            compiled = compiler.regex(constraint.source)
        elif constraint.kind == "choice":
            compiled = compiler.choice(constraint.source)
        else:
            compiled = compiler.lark(constraint.source)
    except GrammarError as exc:
        where = exc.path or constraint.where
        raise InvalidRequest(f"{where} does not compile: {exc.message}", param=where) from None
    if constraint.kind != "json_schema":  # json_object too is one: {"type": "object"}
        return GrammarMatcher(compiled, compiler.ll, log=served.engine.log)
    return GrammarMatcher(compiled, compiler.ll, log=served.engine.log, closers=compiler.closers,
                          budget=max_tokens, closing_texts=tuple(closing_texts(constraint.source)))


def _tool_matcher(served, tools: list[dict], forced: str, is_parallel: bool,
                  max_tokens: int) -> GrammarMatcher:
    compiler = compiler_for(served)
    tools = [_strict(tool) for tool in tools]
    source, trigger = served.chat.tool_grammar(tools, forced, is_parallel)
    try:
        compiled = compiler.lark(source)
    except GrammarError as exc:
        for i, tool in enumerate(tools):  # name the tool whose schema fails, and where
            where = f"tools[{i}].function.parameters"
            try:
                compiler.json_schema(tool["function"].get("parameters") or {"type": "object"}, where)
            except GrammarError as bad:
                where = bad.path or where
                raise InvalidRequest(f"{where} does not compile: {bad.message}", param=where) from None
        raise InvalidRequest(f"tools do not compile: {exc.message}", param="tools") from None
    return GrammarMatcher(compiled, compiler.ll, trigger, log=served.engine.log,
                          closers=compiler.closers, budget=max_tokens,
                          closing_texts=tuple(closing_texts(tools)))


def _strict(tool: dict) -> dict:
    """A function tool with `strict: true`: its parameters' objects closed (grammar/strict.py)."""
    function = tool.get("function") or {}
    if function.get("strict") is not True or not isinstance(function.get("parameters"), dict):
        return tool
    return {**tool, "function": {**function, "parameters": closed(function["parameters"])}}
