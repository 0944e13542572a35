"""Per-request policy: which preset serves this request and what it implies.

Detection lives in `proxy.detect` and the preset table in `proxy.presets`; this module
asks them and folds the answer plus the server config (`--client`, `--tool-parser`)
into one frozen `Policy` that the handlers read. `--client` pins a preset for its own
dialect only; other dialects keep detecting.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from proxy.clients import detect, presets

PRESET_DIALECT = {"anthropic": presets.ANTHROPIC, "openai_chat": presets.CHAT,
                  "openai_responses": presets.RESPONSES}


@dataclass(frozen=True)
class Policy(presets.Defaults):
    preset: str
    dialect: str                 # anthropic | openai_chat | openai_responses
    reasoning: str               # thinking_blocks|responses_item|reasoning_content|inline_tags|strip
    tool_parser: str             # a proxy.toolcalls registry name
    effort: str | None = None
    models: tuple[str, ...] = ()
    client: str = ""
    reason: str = "route fallback"


def resolve(config, dialect: str, path: str, headers, body) -> Policy:
    forced = config.get("CLIENT") or "auto"
    found = detect.detect(path, headers, body, forced=None if forced == "auto" else forced)
    preset = found.preset
    if preset.dialect != PRESET_DIALECT[dialect]:  # a path outside the three dialect routes
        preset = presets.fallback_preset(PRESET_DIALECT[dialect])
    parser = config.get("TOOL_PARSER") or "auto"
    defaults = {f.name: getattr(preset, f.name) for f in dataclasses.fields(presets.Defaults)}
    return Policy(preset=preset.name, dialect=dialect, reasoning=preset.reasoning,
                  tool_parser=preset.tool_parser if parser == "auto" else parser,
                  effort=preset.reasoning_effort, models=preset.models, client=found.client,
                  reason=", ".join(found.reasons), **defaults)
