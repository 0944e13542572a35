"""Request validation: JSON bodies -> frozen request objects, or InvalidRequest naming the field.

Unknown fields are ignored (clients and the proxy pass extras through, as vLLM allows).
"""
import json
from dataclasses import dataclass
from typing import Any

from engined.chat.messages import allowed_tools
from engined.errors import ContextLengthExceeded, InvalidRequest
from engined.grammar.strict import closed
from engined.serving.sampling import (  # noqa: F401 (Sampling, check_for_model: api.*)
    Sampling, check, check_for_model, check_in_vocab, get, parse_sampling, refuse_unoffered,
    token_ids)

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenIds:
    """vLLM's token-id options: `return_token_ids` adds prompt_token_ids and per-choice
    token_ids; `return_tokens_as_token_ids` writes logprob tokens as "token_id:N"."""
    is_returned: bool = False
    is_logprob_ids: bool = False


@dataclass(frozen=True)
class Constraint:
    """What the output must match: kind "json_schema" (source: a schema), "regex", "choice"
    (a list of strings) or "grammar" (Lark); `where` names the field, for errors."""
    kind: str
    source: Any
    where: str


@dataclass(frozen=True)
class ChatRequest:
    messages: Any  # validated by ChatFormat.render (engined.chat.messages)
    tools: Any
    tool_choice: Any
    max_tokens: int | None
    sampling: Sampling
    stream: bool
    include_usage: bool
    num_top_logprobs: int | None  # None: no logprobs
    token_ids: TokenIds = TokenIds()
    constraint: Constraint | None = None
    is_parallel_tools: bool = True
    add_generation_prompt: bool = True
    continue_final: bool = False  # vLLM's continue_final_message: the reply continues it
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in each chunk


@dataclass(frozen=True)
class CompletionRequest:
    prompt_text: str | None
    prompt_ids: list[int] | None
    max_tokens: int
    sampling: Sampling
    stream: bool
    include_usage: bool
    echo: bool
    num_top_logprobs: int | None
    token_ids: TokenIds = TokenIds()
    constraint: Constraint | None = None
    continuous_usage: bool = False  # as ChatRequest's


def require_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _parse_stream(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage): vLLM's continuous_usage_stats puts the usage so
    far in every chunk of a stream, with include_usage only, as vLLM does."""
    stream = get(body, "stream", (bool,), "a boolean", False)
    options = get(body, "stream_options", (dict,), "an object", {})
    include_usage = get(options, "include_usage", (bool,), "a boolean", False)
    continuous = get(options, "continuous_usage_stats", (bool,), "a boolean", False)
    return stream, include_usage, stream and include_usage and continuous


def _parse_token_ids(body: dict) -> TokenIds:
    return TokenIds(get(body, "return_token_ids", (bool,), "a boolean", False),
                    get(body, "return_tokens_as_token_ids", (bool,), "a boolean", False))


def _check_n(body: dict):
    n = get(body, "n", (int,), "an integer", 1)
    check(n == 1, "n", "must be 1: this engine returns one choice per request")


# OpenAI Chat fields that ask for what this engine cannot do (see sampling.UNOFFERED)
CHAT_UNOFFERED = {
    "functions": (([],), "is the deprecated form of tools, which this engine takes: send tools"),
    "function_call": (("none", "auto"), "is the deprecated form of tool_choice: send tools and "
                                        "tool_choice"),
    "audio": ((), "is not supported: this model reads and writes text only"),
    "modalities": ((["text"],), "may only be [\"text\"]: this model writes text only"),
    "web_search_options": ((), "is not supported: this engine has no web search"),
}
COMPLETION_UNOFFERED = {"suffix": (("",), "is not supported: this engine completes after the "
                                          "prompt only (no insertion)")}


def parse_chat(body: Any) -> ChatRequest:
    body = require_object(body)
    refuse_unoffered(body, CHAT_UNOFFERED)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    _check_n(body)
    max_tokens = get(body, "max_completion_tokens", (int,), "an integer")
    if max_tokens is None:
        max_tokens = get(body, "max_tokens", (int,), "an integer")
    check(max_tokens is None or max_tokens >= 1, "max_tokens", "must be at least 1")
    top = None
    if get(body, "logprobs", (bool,), "a boolean", False):
        top = get(body, "top_logprobs", (int,), "an integer", 0)
        check(0 <= top <= MAX_TOP_LOGPROBS, "top_logprobs", f"must be 0..{MAX_TOP_LOGPROBS}")
    stream, include_usage, continuous = _parse_stream(body)
    is_parallel = get(body, "parallel_tool_calls", (bool,), "a boolean", True)
    tools, tool_choice = allowed_tools(body.get("tools"), body.get("tool_choice"))
    return ChatRequest(messages, tools, tool_choice, max_tokens,
                       parse_sampling(body), stream, include_usage, top, _parse_token_ids(body),
                       parse_constraint(body), is_parallel, *parse_turn_end(body), continuous)


def parse_turn_end(body: dict) -> tuple[bool, bool]:
    """vLLM's add_generation_prompt and continue_final_message -> (add_generation_prompt,
    continue_final). Continuing the final message means no new reply's prompt, so with
    continue_final_message true the other defaults to false; both true is a 400 (vLLM's)."""
    continue_final = get(body, "continue_final_message", (bool,), "a boolean", False)
    add_prompt = get(body, "add_generation_prompt", (bool,), "a boolean", not continue_final)
    check(not (continue_final and add_prompt), "continue_final_message",
          "and add_generation_prompt cannot both be true: the reply either continues the "
          "final message or starts a new one")
    return add_prompt, continue_final


_VLLM_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def parse_constraint(body: dict) -> Constraint | None:
    """OpenAI's response_format, or vLLM's structured_outputs {json|regex|choice|grammar}
    (and its older guided_json, guided_regex, guided_choice, guided_grammar fields)."""
    found = [c for c in (_response_format(body), _structured_outputs(body)) if c is not None]
    check(len(found) < 2, "response_format", "and structured_outputs cannot both constrain "
           "the output: send one")
    return found[0] if found else None


def _response_format(body: dict) -> Constraint | None:
    fmt = get(body, "response_format", (dict,), "an object")
    if fmt is None or fmt.get("type") == "text":
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return Constraint("json_schema", {"type": "object"}, "response_format")
    check(kind == "json_schema", "response_format.type",
           f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = get(fmt, "json_schema", (dict,), "an object")
    check(spec is not None, "response_format.json_schema", "is required with type json_schema")
    schema = spec.get("schema", {})
    check(isinstance(schema, (dict, bool)), "response_format.json_schema.schema",
           "must be a JSON schema object")
    return Constraint("json_schema", closed(schema) if spec.get("strict") is True else schema,
                      "response_format.json_schema.schema")


def _structured_outputs(body: dict) -> Constraint | None:
    options = get(body, "structured_outputs", (dict,), "an object") or {}
    given = [(f"structured_outputs.{k}", k, options[k]) for k in _VLLM_KINDS if options.get(k) is not None]
    given += [(f"guided_{k}", k, body[f"guided_{k}"]) for k in _VLLM_KINDS
              if body.get(f"guided_{k}") is not None]
    if not given:
        return None
    where, key, value = given[0]
    if len(given) > 1:
        raise InvalidRequest(f"{where} and {given[1][0]} both constrain the output: send one",
                             param=where)
    if key == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequest(f"{where} is not JSON: {exc}", param=where) from None
    if key == "choice":
        check(isinstance(value, list) and value and all(isinstance(v, str) for v in value),
               where, "must be a non-empty list of strings")
    elif key == "json":
        check(isinstance(value, (dict, bool)), where, "must be a JSON schema")
    else:
        check(isinstance(value, str), where, "must be a string")
    return Constraint(_VLLM_KINDS[key], value, where)


def parse_prompt(prompt: Any) -> tuple[str | None, list[int] | None]:
    """A string, a list of token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt and all(
            isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        return None, prompt
    raise InvalidRequest("prompt must be a string or a non-empty list of token ids "
                         "(one prompt per request)", param="prompt")


def parse_completion(body: Any) -> CompletionRequest:
    body = require_object(body)
    refuse_unoffered(body, COMPLETION_UNOFFERED)
    if "prompt" not in body:
        raise InvalidRequest("prompt is required", param="prompt")
    text, ids = parse_prompt(body["prompt"])
    _check_n(body)
    max_tokens = get(body, "max_tokens", (int,), "an integer", 16)
    check(max_tokens >= 0, "max_tokens", "must not be negative")
    top = get(body, "logprobs", (int,), "an integer")
    check(top is None or 0 <= top <= MAX_TOP_LOGPROBS, "logprobs", f"must be 0..{MAX_TOP_LOGPROBS}")
    echo = get(body, "echo", (bool,), "a boolean", False)
    check(max_tokens > 0 or echo, "max_tokens", "must be at least 1 (0 only with echo)")
    stream, include_usage, continuous = _parse_stream(body)
    return CompletionRequest(text, ids, max_tokens, parse_sampling(body), stream,
                             include_usage, echo, top, _parse_token_ids(body),
                             parse_constraint(body), continuous)


def fit_context(num_prompt_tokens: int, max_tokens: int | None, max_context: int) -> int:
    """-> max_tokens (the rest of the context when unset), or ContextLengthExceeded."""
    if max_tokens is None:
        max_tokens = max_context - num_prompt_tokens
        if max_tokens <= 0:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {max_context} tokens. However, your "
                f"messages resulted in {num_prompt_tokens} tokens. Please reduce the length "
                "of the messages.", param="messages")
    if num_prompt_tokens + max_tokens > max_context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_context} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the "
            f"messages, {max_tokens} in the completion). Please reduce the length of the "
            "messages or completion.", param="messages")
    return max_tokens


def parse_token_ids(body: dict, name: str, vocab_size: int) -> list[int]:
    ids = token_ids(body, name, None)
    if ids is None:
        raise InvalidRequest(f"{name} must be a list of token ids", param=name)
    check_in_vocab(name, ids, vocab_size)
    return list(ids)
