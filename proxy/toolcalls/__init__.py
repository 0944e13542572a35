"""Tool-call text parsers, one module per format; they emit proxy.canonical events (base.py).

    parser = get_parser("kimi", tools)   # tools: the request's declared tool specs, or None
    for chunk in upstream_text: handle(parser.feed(chunk))
    handle(parser.finish())

``PARSER_NAMES`` lists the registry names (aliases included). An unknown name raises
ValueError naming the known ones. ``new_id`` overrides how call ids are made (tests).
"""
from __future__ import annotations

from .base import IdFactory, Parser
from .hermes import HermesParser
from .json_calls import JsonParser
from .kimi import KimiParser
from .kimi_k3 import KimiK3Parser
from .passthrough import PassthroughParser
from .pythonic import PythonicParser
from .think import ThinkSplitter, split_think

_PARSERS: dict[str, type[Parser]] = {
    "passthrough": PassthroughParser,
    "none": PassthroughParser,
    "kimi": KimiParser,
    "kimi_k2": KimiParser,
    "kimi_k3": KimiK3Parser,
    "hermes": HermesParser,
    "json": JsonParser,
    "pythonic": PythonicParser,
}
PARSER_NAMES: tuple[str, ...] = tuple(_PARSERS)


def get_parser(name: str, tools: list[dict] | None = None, new_id: IdFactory | None = None) -> Parser:
    try:
        cls = _PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(PARSER_NAMES)}") from None
    return cls(tools, new_id)


__all__ = ["Parser", "ThinkSplitter", "split_think", "get_parser", "PARSER_NAMES"]
