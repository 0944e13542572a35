"""Client presets: how the proxy behaves for each known client, per dialect (protocols.md §2.2).

A preset is one (client, dialect) pair; ``get_preset(name, dialect)`` returns it or None
when that client never speaks that dialect. Dialects are ``ANTHROPIC`` (``/v1/messages``),
``CHAT`` (``/v1/chat/completions``) and ``RESPONSES`` (``/v1/responses``).

Fields:
* ``reasoning``: how reasoning reaches the client (§2.5): ``thinking_blocks`` (Anthropic
  thinking + signature), ``responses_item`` (reasoning items + encrypted_content),
  ``reasoning_content`` (Chat field/delta), ``inline_tags`` (``<think>…</think>`` in the
  text), ``strip``. Inline ``<think>`` spans from the upstream are always split into
  reasoning first (``proxy.toolcalls.ThinkSplitter``); only ``inline_tags`` puts them back.
* ``tool_parser``: the text parser used when the upstream returned no native tool_calls.
* ``max_tokens`` / ``temperature`` / ``reasoning_effort``: used only when the request omits them.
* ``ping_interval_s``: Anthropic keepalive ``ping`` period while waiting (None: no pings).
* ``small_model``: regex on the requested model selecting ``--small-model``.
* ``passthrough_model``: regex on the requested model sent to the upstream unchanged.
* ``models``: names advertised by ``/v1/models`` for this client.

No preset adds the Chat stream's usage chunk when the request does not ask for it: of the
captured Chat clients, Cline and opencode send ``stream_options.include_usage``, and Aider,
which does not, needs no usage chunk (it reads none from OpenAI either).

Signals used to detect each client live in ``proxy/clients/detect.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

ANTHROPIC, CHAT, RESPONSES = "anthropic", "chat", "responses"
DIALECTS = (ANTHROPIC, CHAT, RESPONSES)
REASONING_POLICIES = ("thinking_blocks", "responses_item", "reasoning_content", "inline_tags", "strip")
_ALLOWED_POLICIES = {
    ANTHROPIC: {"thinking_blocks", "inline_tags", "strip"},
    CHAT: {"reasoning_content", "inline_tags", "strip"},
    RESPONSES: {"responses_item", "strip"},
}
DEFAULT_TOOL_PARSER = "kimi"   # Kimi-Linear and K2 emit K2 control tokens


@dataclass(frozen=True, kw_only=True)
class Defaults:
    """What a preset sets for the requests it serves; their policy (proxy/clients/policy.py)
    carries the same fields on."""
    max_tokens: int | None = None
    temperature: float | None = None
    ping_interval_s: float | None = None
    small_model: str | None = None
    passthrough_model: str | None = None


@dataclass(frozen=True)
class Preset(Defaults):
    name: str
    dialect: str
    reasoning: str
    status: str = "stable"
    tool_parser: str = DEFAULT_TOOL_PARSER
    reasoning_effort: str | None = None
    models: tuple[str, ...] = ("kimi-local",)

    def __post_init__(self):
        if self.dialect not in DIALECTS:
            raise ValueError(f"preset {self.name}: unknown dialect {self.dialect!r}")
        if self.reasoning not in _ALLOWED_POLICIES[self.dialect]:
            raise ValueError(f"preset {self.name}: reasoning {self.reasoning!r} is invalid for {self.dialect}")


def _anthropic(name: str, **kw) -> Preset:
    kw.setdefault("ping_interval_s", 10.0)
    return Preset(name, ANTHROPIC, kw.pop("reasoning", "thinking_blocks"), **kw)


def _chat(name: str, **kw) -> Preset:
    return Preset(name, CHAT, kw.pop("reasoning", "reasoning_content"), **kw)


def _responses(name: str, **kw) -> Preset:
    return Preset(name, RESPONSES, kw.pop("reasoning", "responses_item"), **kw)


_CLAUDE_MODELS = ("claude-sonnet-4-5", "claude-opus-4-1", "claude-3-5-haiku-20241022")
_PRESET_LIST = (
    _anthropic("claude-code", max_tokens=32000, reasoning_effort="medium",
               small_model=r"(?i)haiku", models=_CLAUDE_MODELS),
    _responses("codex", max_tokens=32000, reasoning_effort="medium", models=("kimi-local", "gpt-5-codex")),
    _chat("opencode", status="provisional", max_tokens=16384),
    _responses("opencode", status="provisional", max_tokens=16384),
    _anthropic("opencode", status="provisional", max_tokens=16384),
    _chat("cline", status="provisional", max_tokens=16384, temperature=0.0),
    _responses("cline", status="provisional", max_tokens=16384),
    _anthropic("cline", status="provisional", max_tokens=16384),
    # Aider-only behaviour (inline <think> tags), for a client that names itself Aider.
    # Aider 0.86 itself sends the OpenAI SDK's user agent and gets the chat fallback.
    _chat("aider", reasoning="inline_tags", status="provisional", max_tokens=16384, temperature=0.0),
    _chat("kimi-code", status="provisional", max_tokens=32000, temperature=0.6, reasoning_effort="medium",
          passthrough_model=r"(?i)^kimi-", models=("kimi-local", "kimi-k2-thinking", "kimi-latest")),
    # Route fallbacks: plain SDKs, curl, LiteLLM and anything unrecognised.
    _chat("openai-sdk", max_tokens=8192),
    _responses("openai-sdk", max_tokens=32000),
    _anthropic("anthropic-sdk", max_tokens=8192, small_model=r"(?i)haiku", models=_CLAUDE_MODELS),
)
PRESETS: dict[tuple[str, str], Preset] = {(p.name, p.dialect): p for p in _PRESET_LIST}
PRESET_NAMES: tuple[str, ...] = tuple(dict.fromkeys(p.name for p in _PRESET_LIST))
FALLBACK = {ANTHROPIC: "anthropic-sdk", CHAT: "openai-sdk", RESPONSES: "openai-sdk"}


def get_preset(name: str, dialect: str) -> Preset | None:
    return PRESETS.get((name, dialect))


def fallback_preset(dialect: str) -> Preset:
    return PRESETS[(FALLBACK[dialect], dialect)]


def check_client_name(name: str) -> str:
    """Validate a ``--client`` value once at start-up; returns it or raises ValueError."""
    if name not in PRESET_NAMES:
        raise ValueError(f"unknown client preset {name!r}; known: {', '.join(PRESET_NAMES)}")
    return name


SETUP_LINES = {
    "claude-code": "ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN={token} ANTHROPIC_MODEL={model} claude",
    "codex": ('codex -c model_provider=kimi -c model="{model}" -c model_providers.kimi.name=kimi '
              '-c model_providers.kimi.base_url={base}/v1 -c model_providers.kimi.wire_api=responses '
              '-c model_providers.kimi.env_key=KIMI_API_KEY   # {codex_note}'),
    "opencode": ('opencode.json provider: {{"npm":"@ai-sdk/openai-compatible","options":'
                 '{{"baseURL":"{base}/v1","apiKey":"{json_token}"}},"models":{{"{model}":{{"tool_call":true}}}}}}'),
    "aider": "OPENAI_API_BASE={base}/v1 OPENAI_API_KEY={token} aider --model openai/{model}",
    "openai-sdk": "OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY={token}",
    "anthropic-sdk": "ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY={token}",
}


def setup_text(base: str, model: str, token: str = "local") -> str:
    """Copy-paste set-up lines printed at start-up, one ``client: line`` per client. A token
    "$VAR" is read from that variable (opencode's JSON spells it {env:VAR})."""
    is_var = token.startswith("$")
    fields = {"base": base, "model": model, "token": token,
              "json_token": "{env:" + token[1:] + "}" if is_var else token,
              "codex_note": f"with {token[1:]} exported" if is_var else f"with KIMI_API_KEY={token}"}
    return "\n".join(f"{client}: {line.format(**fields)}" for client, line in SETUP_LINES.items())