"""Per-request policy: which preset serves this request and what it implies.

Detection lives in `proxy.detect` and the preset table in `proxy.presets`; this module
asks them and folds the answer plus the server config (`--client`, `--tool-parser`)
into one frozen `Policy` that the handlers read. `--client` pins a preset for its own
dialect only; other dialects keep detecting.
"""
from __future__ import annotations

from dataclasses import dataclass

from proxy.clients import detect, presets

PRESET_DIALECT = {"anthropic": presets.ANTHROPIC, "openai_chat": presets.CHAT,
                  "openai_responses": presets.RESPONSES}


@dataclass(frozen=True)
class Policy:
    preset: str
    dialect: str                 # anthropic | openai_chat | openai_responses
    reasoning: str               # thinking_blocks|responses_item|reasoning_content|inline_tags|strip
    tool_parser: str             # a proxy.toolcalls registry name
    max_tokens: int | None = None
    temperature: float | None = None
    effort: str | None = None
    ping_interval_s: float | None = None
    small_model: str | None = None
    passthrough_model: str | None = None
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
    return Policy(preset=preset.name, dialect=dialect, reasoning=preset.reasoning,
                  tool_parser=preset.tool_parser if parser == "auto" else parser,
                  max_tokens=preset.max_tokens, temperature=preset.temperature,
                  effort=preset.reasoning_effort, ping_interval_s=preset.ping_interval_s,
                  small_model=preset.small_model, passthrough_model=preset.passthrough_model,
                  models=preset.models, client=found.client, reason=", ".join(found.reasons))
