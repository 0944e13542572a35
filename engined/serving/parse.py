"""Request validation: JSON bodies -> frozen request objects, or InvalidRequest naming the field.

Unknown fields are ignored (clients and the proxy pass extras through, as vLLM allows).
"""
import json
from dataclasses import dataclass
from typing import Any

from engined.errors import ContextLengthExceeded, InvalidRequest
from engined.grammar.strict import closed

MAX_TOP_LOGPROBS = 20
_NUMBER = (int, float)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    speculative: bool = True  # false: no drafts for this request (engine/speculate.py)
    spec_metrics: bool = False  # vLLM's metrics.speculative_decoding on the response
    presence_penalty: float = 0.0  # these four: engine/penalties.py
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); ids checked at submit


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


def _get(body: dict, name: str, kinds: tuple, what: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise InvalidRequest(f"{name} must be {what}, got {type(value).__name__}", param=name)
    return value


def _check(is_ok: bool, name: str, message: str):
    if not is_ok:
        raise InvalidRequest(f"{name} {message}", param=name)


def require_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_sampling(body: dict) -> Sampling:
    temperature = float(_get(body, "temperature", _NUMBER, "a number", 1.0))
    _check(0 <= temperature <= 100, "temperature", "must be between 0 and 100")
    top_p = float(_get(body, "top_p", _NUMBER, "a number", 1.0))
    _check(0 < top_p <= 1, "top_p", "must be in (0, 1]")
    top_k = _get(body, "top_k", (int,), "an integer", 0)
    _check(top_k >= -1, "top_k", "must be -1 (off), 0 (off) or a positive count")
    seed = _get(body, "seed", (int,), "an integer")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = (stop,)
    elif stop is None:
        stop = ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    ignore_eos = _get(body, "ignore_eos", (bool,), "a boolean", False)
    speculative = _get(body, "speculative", (bool,), "a boolean", True)
    spec_metrics = _get(body, "spec_decode_metrics", (bool,), "a boolean", False)
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's range
        penalties[name] = float(_get(body, name, _NUMBER, "a number", 0.0))
        _check(-2 <= penalties[name] <= 2, name, "must be between -2 and 2")
    repetition = float(_get(body, "repetition_penalty", _NUMBER, "a number", 1.0))
    _check(0 < repetition <= 100, "repetition_penalty", "must be in (0, 100] (1: off)")
    return Sampling(temperature, top_p, max(top_k, 0), seed, stop, ignore_eos, speculative,
                    spec_metrics, penalties["presence_penalty"], penalties["frequency_penalty"],
                    repetition, _logit_bias(body))


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} -> ((id, bias), ...)."""
    given = _get(body, "logit_bias", (dict,), "an object mapping token ids to biases", {})
    pairs = []
    for key, bias in given.items():
        try:
            token_id = int(key)
        except ValueError:
            raise InvalidRequest(f"logit_bias: {key!r} is not a token id", param="logit_bias") from None
        _check(isinstance(bias, _NUMBER) and not isinstance(bias, bool) and -100 <= bias <= 100,
               "logit_bias", f"values must be numbers between -100 and 100, got {bias!r} for {key!r}")
        pairs.append((token_id, float(bias)))
    return tuple(pairs)


def _parse_stream(body: dict) -> tuple[bool, bool]:
    stream = _get(body, "stream", (bool,), "a boolean", False)
    options = _get(body, "stream_options", (dict,), "an object", {})
    include_usage = _get(options, "include_usage", (bool,), "a boolean", False)
    return stream, include_usage


def _parse_token_ids(body: dict) -> TokenIds:
    return TokenIds(_get(body, "return_token_ids", (bool,), "a boolean", False),
                    _get(body, "return_tokens_as_token_ids", (bool,), "a boolean", False))


def _check_n(body: dict):
    n = _get(body, "n", (int,), "an integer", 1)
    _check(n == 1, "n", "must be 1: this engine returns one choice per request")


def parse_chat(body: Any) -> ChatRequest:
    body = require_object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    _check_n(body)
    max_tokens = _get(body, "max_completion_tokens", (int,), "an integer")
    if max_tokens is None:
        max_tokens = _get(body, "max_tokens", (int,), "an integer")
    _check(max_tokens is None or max_tokens >= 1, "max_tokens", "must be at least 1")
    top = None
    if _get(body, "logprobs", (bool,), "a boolean", False):
        top = _get(body, "top_logprobs", (int,), "an integer", 0)
        _check(0 <= top <= MAX_TOP_LOGPROBS, "top_logprobs", f"must be 0..{MAX_TOP_LOGPROBS}")
    stream, include_usage = _parse_stream(body)
    is_parallel = _get(body, "parallel_tool_calls", (bool,), "a boolean", True)
    return ChatRequest(messages, body.get("tools"), body.get("tool_choice"), max_tokens,
                       parse_sampling(body), stream, include_usage, top, _parse_token_ids(body),
                       parse_constraint(body), is_parallel)


_VLLM_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def parse_constraint(body: dict) -> Constraint | None:
    """OpenAI's response_format, or vLLM's structured_outputs {json|regex|choice|grammar}
    (and its older guided_json, guided_regex, guided_choice, guided_grammar fields)."""
    found = [c for c in (_response_format(body), _structured_outputs(body)) if c is not None]
    _check(len(found) < 2, "response_format", "and structured_outputs cannot both constrain "
           "the output: send one")
    return found[0] if found else None


def _response_format(body: dict) -> Constraint | None:
    fmt = _get(body, "response_format", (dict,), "an object")
    if fmt is None or fmt.get("type") == "text":
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return Constraint("json_schema", {"type": "object"}, "response_format")
    _check(kind == "json_schema", "response_format.type",
           f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = _get(fmt, "json_schema", (dict,), "an object")
    _check(spec is not None, "response_format.json_schema", "is required with type json_schema")
    schema = spec.get("schema", {})
    _check(isinstance(schema, (dict, bool)), "response_format.json_schema.schema",
           "must be a JSON schema object")
    return Constraint("json_schema", closed(schema) if spec.get("strict") is True else schema,
                      "response_format.json_schema.schema")


def _structured_outputs(body: dict) -> Constraint | None:
    options = _get(body, "structured_outputs", (dict,), "an object") or {}
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
        _check(isinstance(value, list) and value and all(isinstance(v, str) for v in value),
               where, "must be a non-empty list of strings")
    elif key == "json":
        _check(isinstance(value, (dict, bool)), where, "must be a JSON schema")
    else:
        _check(isinstance(value, str), where, "must be a string")
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
    if "prompt" not in body:
        raise InvalidRequest("prompt is required", param="prompt")
    text, ids = parse_prompt(body["prompt"])
    _check_n(body)
    max_tokens = _get(body, "max_tokens", (int,), "an integer", 16)
    _check(max_tokens >= 0, "max_tokens", "must not be negative")
    top = _get(body, "logprobs", (int,), "an integer")
    _check(top is None or 0 <= top <= MAX_TOP_LOGPROBS, "logprobs", f"must be 0..{MAX_TOP_LOGPROBS}")
    echo = _get(body, "echo", (bool,), "a boolean", False)
    _check(max_tokens > 0 or echo, "max_tokens", "must be at least 1 (0 only with echo)")
    stream, include_usage = _parse_stream(body)
    return CompletionRequest(text, ids, max_tokens, parse_sampling(body), stream,
                             include_usage, echo, top, _parse_token_ids(body),
                             parse_constraint(body))


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
    ids = body.get(name)
    if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InvalidRequest(f"{name} must be a list of token ids", param=name)
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise InvalidRequest(f"{name}: token id {bad[0]} is not in the vocabulary "
                             f"[0, {vocab_size})", param=name)
    return ids
