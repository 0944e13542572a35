"""The upstream's context: learnt once per upstream; the prompt counted only when it might not fit.

    context   kimi-engine, vLLM, SGLang: GET /v1/models, the first model's `max_model_len`;
              llama.cpp: GET /props, `default_generation_settings.n_ctx` (the context of one
              slot; its /v1/models names only the training context); else the maximum an
              overflow error named.
    count     kimi-engine, vLLM: POST /tokenize {model, messages, tools} -> {count, ...};
              llama.cpp: POST /apply-template {messages, tools} -> {prompt}, then
              POST /tokenize {content} -> {tokens}. SGLang's /tokenize takes no messages.

A prompt has fewer tokens than its body has bytes, plus the few its template adds: a request
whose body and max_tokens fit the context with that margin is sent as it is, with no added
round trip. Only a request that might not fit is counted: a prompt that cannot fit is
answered with the overflow error before it is sent (in OpenAI's words, which clients and
LiteLLM match), and a max_tokens that cannot fit is
lowered to the room left.
"""
from __future__ import annotations

import logging

from proxy.errors import ContextTooLong
from proxy.upstream.status import context_too_long, mark_turn, status_error

log = logging.getLogger("kimi.proxy")
TEMPLATE_TOKENS = 256  # what a chat template adds to the body's bytes, at most
MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens")


def is_llama_cpp(card: dict) -> bool:
    """llama-server's model card: owned_by "llamacpp", with a `meta` object (n_ctx_train, ...)."""
    return card.get("owned_by") == "llamacpp" or isinstance(card.get("meta"), dict)


def llama_cpp_props(upstream) -> dict:
    """What llama-server's GET /props says: the context of one slot ("max_model_len") and,
    where its modalities say no vision (no --mmproj), "text_only"."""
    status, body = upstream.request_json("GET", upstream.target.root_prefix + "/props")
    body = body if status < 400 and isinstance(body, dict) else {}
    settings, modalities = body.get("default_generation_settings"), body.get("modalities")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    info = {"max_model_len": n_ctx} if isinstance(n_ctx, int) and n_ctx > 0 else {}
    if isinstance(modalities, dict) and modalities.get("vision") is False:
        info["text_only"] = True
    return info


def count_prompt(upstream, messages: list, tools: list | None, model: str | None) -> int | None:
    """The prompt's tokens as the upstream counts them (its template included), or None."""
    root = upstream.target.root_prefix
    extra = {"tools": tools} if tools else {}
    if upstream.is_llama_cpp:
        status, data = upstream.request_json("POST", root + "/apply-template", {"messages": messages, **extra})
        prompt = data.get("prompt") if status < 400 and isinstance(data, dict) else None
        if not isinstance(prompt, str):
            return None
        status, data = upstream.request_json("POST", root + "/tokenize", {"content": prompt})
    else:
        status, data = upstream.request_json("POST", root + "/tokenize",
                                             {"model": model, "messages": messages, **extra})
    if status >= 400:  # a server that checks the length while it counts: its refusal names the count
        err = status_error(status, data)
        return err.tokens if isinstance(err, ContextTooLong) else None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("count"), int):
        return data["count"]
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


def fit(upstream, payload: dict, body_bytes: int, context: int | None, truncate: bool = False) -> dict:
    """The payload, its max_tokens lowered to the room the prompt leaves; raises ContextTooLong
    for a prompt that cannot fit (truncate: unless dropping turns from its middle makes it fit).
    Unknown context or count: the upstream's own answer stands."""
    if not context:
        return payload
    key = next((k for k in MAX_TOKENS_KEYS if payload.get(k)), None)
    asked = payload[key] if key else 0
    if body_bytes + asked + TEMPLATE_TOKENS <= context:
        return payload
    count = upstream.tokenize(payload["messages"], payload.get("tools"), payload.get("model"))
    if count is None:
        return payload
    if count >= context and truncate:
        payload, count = middle_dropped(upstream, payload, context, asked or context, count)
    if count >= context:  # the upstream needs room for one token at least
        err = context_too_long(f"This model's maximum context length is {context} tokens. However, "
                               f"your messages resulted in {count} tokens", count, context)
        raise mark_turn(err, payload["messages"])
    room = context - count
    if key is None or asked <= room:
        return payload
    log.info("max_tokens %d lowered to %d: prompt %d of %d context tokens", asked, room, count, context)
    return {**payload, key: room}


def middle_dropped(upstream, payload: dict, context: int, asked: int, count: int) -> tuple[dict, int]:
    """Responses' `truncation: "auto"`, as OpenAI documents it (input items dropped in the middle
    of the conversation): (the payload without as few of its middle turns as leave room for the
    reply, its count). What comes before the first reply stays (the instructions, and the user
    messages that set the task: Codex sends its environment, then the task), and so do the
    latest turns and the last user message; the kept tail starts at a user or assistant message,
    so no tool result loses its call. The room wanted is max_tokens, at most a quarter of the
    context; when no cut leaves that much, the latest cut that fits at all. Counted by
    bisection: a few /tokenize calls, for a request that did not fit only."""
    messages = payload["messages"]
    roles = [m.get("role") for m in messages]
    head = next((i for i, role in enumerate(roles) if role in ("assistant", "tool")), len(roles))
    if "user" not in roles[:head]:
        return payload, count
    last_user = max(i for i, role in enumerate(roles) if role == "user")
    end = last_user if last_user > head else len(roles) - 1  # an agent loop ends on results
    cuts = [j for j in range(head + 1, end + 1) if roles[j] in ("user", "assistant")]
    want = context - min(asked, context // 4)
    counted: dict[int, int | None] = {}

    def tokens(cut: int) -> int | None:
        if cut not in counted:
            counted[cut] = upstream.tokenize(messages[:head] + messages[cut:], payload.get("tools"),
                                             payload.get("model"))
        return counted[cut]

    lo, hi, best = 0, len(cuts) - 1, None
    while lo <= hi:  # the earliest cut whose count leaves the room wanted
        mid = (lo + hi) // 2
        n = tokens(cuts[mid])
        if n is None:
            return payload, count
        if n <= want:
            best, hi = cuts[mid], mid - 1
        else:
            lo = mid + 1
    if best is None and cuts and (tokens(cuts[-1]) or context) < context:
        best = cuts[-1]
    if best is None:
        return payload, count
    log.info("truncation auto: %d messages after the first reply's left out, prompt %d -> %d of %d "
             "context tokens", best - head, count, counted[best], context)
    return {**payload, "messages": messages[:head] + messages[best:]}, counted[best]
