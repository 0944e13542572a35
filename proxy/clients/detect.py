"""Per-request client detection: route + headers + body -> preset (protocols.md §2.1).

    detection = detect(path, headers, body, forced=config_client)
    detection.preset      # proxy.presets.Preset for this route's dialect
    detection.client      # label for logs/metrics (may name a client the fallback serves)
    detection.reasons     # ("user-agent ~ /^claude-cli\\//", "header x-app", ...)

The route picks the dialect; only presets that speak it are eligible. Strong signals,
derived from the live captures in ../shared/fixtures/live-clients/:

* user agent (first matching pattern, 40 points): ``claude-cli/``, ``codex_exec/``,
  ``opencode/``, ``OpenAI/Python``, ``Anthropic/…``, ``KimiCLI``;
* headers (25 each): ``x-app: cli``, ``anthropic-beta: claude-code-…``,
  ``x-claude-code-session-id`` (Claude Code); ``originator: codex_…``, ``x-codex-*`` (Codex);
  ``x-session-affinity`` (opencode); ``http-referer: cline.bot``, ``x-title: Cline``;
  ``x-msh-*`` (Kimi Code, provisional); ``x-stainless-lang`` (the OpenAI/Anthropic SDKs,
  which are also the route fallbacks, so this only names the client);
* the system prompt (30): Cline's CLI sends only the generic AI-SDK user agent, so its
  prompt ("You are Cline, …") is its signal.

With a strong signal the preset's weight and 2 points per listed body key are added; body
keys alone never count. Without any, the route fallback wins (score 1): openai-sdk for
Chat and Responses, anthropic-sdk for Messages. Ties go to the earlier preset in ``ORDER``.

Aider 0.86 sends the OpenAI SDK's user agent on Chat and LiteLLM's on Messages, so its
requests get the generic SDK preset (the route fallback), which serves it correctly
(reasoning in ``reasoning_content``, which Aider shows as THINKING). Its system prompt
only relabels ``client`` as "aider". The ``aider`` preset (inline ``<think>`` tags) needs a user agent
that names Aider; a bare ``litellm/`` agent never gets it.

``forced`` (``--client``) applies only on routes whose dialect that preset speaks; elsewhere
detection runs as usual. Detection never raises; ``check_client_name`` validates ``forced``.

Detection is a function of what it reads (``inputs``): the path, the values of the headers a
pattern matches, the presence of the others, the first system texts and which listed body
keys are there. Its answers are memoised on those (``_detect``), so the regexes run once per
client and prompt, not once per request (they cost 40 us a request, issue 28).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from .presets import ANTHROPIC, CHAT, RESPONSES, Preset, fallback_preset, get_preset

UA_POINTS, HEADER_POINTS, PROMPT_POINTS, BODY_KEY_POINTS, FORCED_SCORE = 40, 25, 30, 2, 10_000
PROMPT_CHARS = 600


@dataclass(frozen=True)
class Signals:
    user_agent: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()   # (lower-case header name, value regex)
    prompt: tuple[str, ...] = ()                # regexes searched in the first system texts
    body_keys: tuple[str, ...] = ()
    weight: int = 0


SIGNALS: dict[str, Signals] = {
    "claude-code": Signals(
        user_agent=(r"^claude-cli/",),
        headers=(("x-app", r"^cli$"), ("anthropic-beta", r"(^|,)\s*claude-code-\d+"),
                 ("x-claude-code-session-id", r".")),
        body_keys=("system", "max_tokens", "thinking", "context_management"), weight=30),
    "codex": Signals(
        user_agent=(r"^codex[_-]", r"^codex/"),
        headers=(("originator", r"^codex"), ("x-codex-beta-features", r"."), ("x-codex-turn-metadata", r".")),
        body_keys=("input", "prompt_cache_key", "client_metadata"), weight=30),
    "kimi-code": Signals(
        user_agent=(r"(?i)kimi[_-]?(code|cli)",),
        headers=(("x-msh-client", r"."), ("x-msh-platform", r".")), weight=20),
    "cline": Signals(
        user_agent=(r"(?i)\bcline\b",),
        headers=(("http-referer", r"cline\.bot"), ("x-title", r"(?i)cline")),
        prompt=(r"^You are Cline\b",), weight=20),
    "opencode": Signals(
        user_agent=(r"(?i)^opencode/",), headers=(("x-session-affinity", r"."),), weight=20),
    "aider": Signals(user_agent=(r"(?i)\baider\b",), weight=10),
    "openai-sdk": Signals(user_agent=(r"^(Async)?OpenAI/",), headers=(("x-stainless-lang", r"."),)),
    "anthropic-sdk": Signals(user_agent=(r"^(Async)?Anthropic/",), headers=(("x-stainless-lang", r"."),)),
}
ORDER = ("claude-code", "codex", "kimi-code", "cline", "opencode", "aider", "openai-sdk", "anthropic-sdk")
# Clients recognised only to label logs and metrics; the route fallback serves them.
CLIENT_HINTS = (("aider", r"^Act as an expert (software developer|architect engineer|code analyst)"),)

_ROUTES = {
    "/v1/messages": ANTHROPIC, "/messages": ANTHROPIC, "/v1/messages/count_tokens": ANTHROPIC,
    "/v1/chat/completions": CHAT, "/chat/completions": CHAT,
    "/v1/responses": RESPONSES, "/responses": RESPONSES,
}


@dataclass(frozen=True)
class Detection:
    preset: Preset
    client: str
    dialect: str
    score: int
    reasons: tuple[str, ...]
    is_fallback: bool = False
    is_forced: bool = False


def route_dialect(path: str, headers: Mapping[str, str] | None = None) -> str | None:
    """Dialect of a request path (query string ignored); None for paths with no dialect."""
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path in _ROUTES:
        return _ROUTES[path]
    if path.startswith(("/v1/responses/", "/responses/")):
        return RESPONSES
    if path in ("/v1/models", "/models") or path.startswith("/v1/models/"):
        return ANTHROPIC if headers and "anthropic-version" in headers else CHAT
    return None


def normalize_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> dict[str, str]:
    """Lower-cased names; repeated headers joined with commas; junk input gives {}."""
    out: dict[str, str] = {}
    try:
        for name, value in headers.items() if isinstance(headers, Mapping) else (headers or ()):
            key = str(name).lower()
            out[key] = f"{out[key]},{value}" if key in out else str(value)
    except (TypeError, ValueError):
        return {}
    return out


def _texts(content) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def system_texts(body) -> list[str]:
    """The first system/developer texts of a body in any dialect, each cut to PROMPT_CHARS."""
    if not isinstance(body, dict):
        return []
    texts = _texts(body.get("system")) + _texts(body.get("instructions"))
    items = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    for item in items[:3] if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("role") in ("system", "developer"):
            texts += _texts(item.get("content"))
    return [t.lstrip()[:PROMPT_CHARS] for t in texts[:4]]


def _score(name: str, headers: dict[str, str], prompts, body_keys: frozenset) -> tuple[int, list[str]]:
    sig = SIGNALS[name]
    score, reasons = 0, []
    ua = headers.get("user-agent", "")
    for pattern in sig.user_agent:
        if re.search(pattern, ua):
            score, reasons = score + UA_POINTS, reasons + [f"user-agent ~ /{pattern}/"]
            break
    for header, pattern in sig.headers:
        if header in headers and re.search(pattern, headers[header]):
            score, reasons = score + HEADER_POINTS, reasons + [f"header {header}"]
    for pattern in sig.prompt:
        if any(re.search(pattern, text) for text in prompts):
            score, reasons = score + PROMPT_POINTS, reasons + [f"system prompt ~ /{pattern}/"]
            break
    if not score:
        return 0, []
    keys = [k for k in sig.body_keys if k in body_keys]
    if keys:
        reasons.append("body keys " + "+".join(keys))
    return score + sig.weight + BODY_KEY_POINTS * len(keys), reasons


def _hinted_client(prompts: list[str]) -> str | None:
    for client, pattern in CLIENT_HINTS:
        if any(re.search(pattern, text) for text in prompts):
            return client
    return None


PRESENCE = r"."  # a header pattern that asks only whether the header has a value


def _headers_read() -> dict[str, bool]:
    """Lower-case header name -> whether detection reads its value (else only its presence)."""
    patterns: dict[str, set] = {"user-agent": {"^"}, "anthropic-version": {PRESENCE}}  # route_dialect's
    for sig in SIGNALS.values():
        for name, pattern in sig.headers:
            patterns.setdefault(name, set()).add(pattern)
    return {name: found != {PRESENCE} for name, found in patterns.items()}


_VALUE_READ = _headers_read()
_ENVIRON = [(name, "HTTP_" + name.upper().replace("-", "_")) for name in _VALUE_READ]  # WSGI's names
_BODY_KEYS = tuple(dict.fromkeys(k for sig in SIGNALS.values() for k in sig.body_keys))
_HAS_VALUE = re.compile(PRESENCE)


def inputs(path: str, headers=None, body=None) -> tuple:
    """(path, headers read, system texts, listed body keys present): all detection reads."""
    environ = getattr(headers, "environ", None)  # werkzeug's EnvironHeaders: no walk over them all
    if isinstance(environ, dict):
        found = [(name, environ[key]) for name, key in _ENVIRON if key in environ]
    else:
        hdrs = normalize_headers(headers)
        found = [(name, hdrs[name]) for name in _VALUE_READ if name in hdrs]
    read = tuple((name, value if _VALUE_READ[name] else bool(_HAS_VALUE.search(value))) for name, value in found)
    keys = frozenset(k for k in _BODY_KEYS if k in body) if isinstance(body, dict) else frozenset()
    return path, read, tuple(system_texts(body)), keys


def detect(path: str, headers=None, body=None, forced: str | None = None) -> Detection:
    return _detect(*inputs(path, headers, body), forced)


@functools.lru_cache(maxsize=1024)
def _detect(path: str, read: tuple, prompts: tuple, body_keys: frozenset, forced: str | None) -> Detection:
    hdrs = {name: value if _VALUE_READ[name] else ("x" if value else "") for name, value in read}
    dialect = route_dialect(path, hdrs)
    if dialect is None:
        fallback = fallback_preset(CHAT)
        return Detection(fallback, fallback.name, CHAT, 0, ("no dialect for this path",), is_fallback=True)
    if forced and get_preset(forced, dialect) is not None:
        return Detection(get_preset(forced, dialect), forced, dialect, FORCED_SCORE, (f"--client {forced}",),
                         is_forced=True)
    best, best_score, best_reasons = None, 0, []
    for name in ORDER:
        if get_preset(name, dialect) is None:
            continue
        score, reasons = _score(name, hdrs, prompts, body_keys)
        if score > best_score:
            best, best_score, best_reasons = name, score, reasons
    fallback = fallback_preset(dialect)
    if best is None:
        best, best_score, best_reasons = fallback.name, 1, ["route fallback for this path"]
    preset = get_preset(best, dialect)
    client, hinted = best, _hinted_client(prompts) if best == fallback.name else None
    if hinted:
        client = hinted
        best_reasons.append(f"system prompt looks like {hinted}; served by the {best} preset")
    return Detection(preset, client, dialect, best_score, tuple(best_reasons),
                     is_fallback=best_score == 1)
