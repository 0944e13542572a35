"""The sampling fields of a request (chat and completions alike) -> Sampling, or
InvalidRequest naming the field. The validation helpers the rest of parse.py shares."""
import re
from dataclasses import dataclass
from typing import Any

from engined.errors import InvalidRequest

NUMBER = (int, float)
GREEDY_BELOW = 1e-5  # a temperature below this is greedy (vLLM's _SAMPLING_EPS)


def get(body: dict, name: str, kinds: tuple, what: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise InvalidRequest(f"{name} must be {what}, got {type(value).__name__}", param=name)
    return value


def check(is_ok: bool, name: str, message: str):
    if not is_ok:
        raise InvalidRequest(f"{name} {message}", param=name)


def number(body: dict, name: str, default: float, low: float, high: float) -> float:
    """A number field in [low, high] as a float (an integer too large for a float, NaN or
    an infinity is out of range: a 400 naming the field, never an OverflowError)."""
    value = _as_float(get(body, name, NUMBER, "a number", default))
    check(low <= value <= high, name, f"must be between {low:g} and {high:g}")
    return value


def _as_float(value) -> float:
    """float(value); NaN for an integer too large for a float (fails every range check)."""
    try:
        return float(value)
    except OverflowError:
        return float("nan")


def token_ids(body: dict, name: str, default=()) -> tuple[int, ...] | None:
    """A list of token ids (`default` when absent or null), or a 400 naming the field."""
    ids = get(body, name, (list,), "a list of token ids", default)
    check(ids is default or all(isinstance(i, int) and not isinstance(i, bool) for i in ids),
          name, "must be a list of token ids")
    return ids if ids is default else tuple(ids)


def check_in_vocab(name: str, ids, vocab: int):
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequest(f"{name}: token id {bad[0]} is not in the vocabulary [0, {vocab})",
                             param=name)


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
    min_p: float = 0.0  # vLLM's: a drawn token's probability >= min_p x the top one's
    min_tokens: int = 0  # vLLM's: no stop token or stop string before this many tokens
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: more ids that end the output
    include_stop: bool = False  # vLLM's include_stop_str_in_output: a `stop` hit is kept
    allowed_token_ids: tuple[int, ...] = ()  # vLLM's: only these may be drawn (): all)
    prediction: str = ""  # OpenAI's Predicted Outputs: text the reply is expected to repeat


def parse_sampling(body: dict) -> Sampling:
    temperature = number(body, "temperature", 1.0, 0, 100)
    temperature = 0.0 if temperature < GREEDY_BELOW else temperature  # vLLM's: logits / 1e-300 are inf
    top_p = number(body, "top_p", 1.0, 0, 1)
    check(top_p > 0, "top_p", "must be in (0, 1]")
    top_k = get(body, "top_k", (int,), "an integer", 0)
    check(top_k >= -1, "top_k", "must be -1 (off), 0 (off) or a positive count")
    seed = get(body, "seed", (int,), "an integer")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = (stop,)
    elif stop is None:
        stop = ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    ignore_eos = get(body, "ignore_eos", (bool,), "a boolean", False)
    speculative = get(body, "speculative", (bool,), "a boolean", True)
    spec_metrics = get(body, "spec_decode_metrics", (bool,), "a boolean", False)
    penalties = {name: number(body, name, 0.0, -2, 2)  # OpenAI's range
                 for name in ("presence_penalty", "frequency_penalty")}
    repetition = number(body, "repetition_penalty", 1.0, 0.01, 100)  # 1: off; a logit / 1e-40 is inf
    min_p = number(body, "min_p", 0.0, 0, 1)
    min_tokens = get(body, "min_tokens", (int,), "an integer", 0)
    check(min_tokens >= 0, "min_tokens", "must not be negative")
    stop_ids = token_ids(body, "stop_token_ids")
    allowed = token_ids(body, "allowed_token_ids", None)
    check(allowed != (), "allowed_token_ids", "must name at least one token")
    include_stop = get(body, "include_stop_str_in_output", (bool,), "a boolean", False)
    refuse_unoffered(body, UNOFFERED)
    return Sampling(temperature, top_p, max(top_k, 0), seed, stop, ignore_eos, speculative,
                    spec_metrics, penalties["presence_penalty"], penalties["frequency_penalty"],
                    repetition, _logit_bias(body), min_p, min_tokens, stop_ids, include_stop,
                    allowed or (), _prediction(body.get("prediction")))


def _prediction(value) -> str:
    """OpenAI's `prediction` {"type": "content", "content": text or [{"type": "text", "text"}]}
    -> its text ("" when absent): the speculative drafts look it up too (engine/speculate.py)."""
    if value is None:
        return ""
    content = value.get("content") if isinstance(value, dict) and value.get("type") == "content" else None
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise InvalidRequest('prediction must be {"type": "content", "content": a string or a list '
                             'of {"type": "text", "text": ...} parts}', param="prediction")
    return content


# vLLM sampling fields this engine does not offer -> (the values that ask nothing, why not).
# Any other value is a 400 rather than a reply that silently ignores it (parse.py has the
# routes' own tables).
UNOFFERED = {
    "best_of": ((1, 1.0), "must be 1: this engine draws one sample per request"),
    "use_beam_search": ((False,), "is not supported: this engine samples (temperature 0 is greedy)"),
    "bad_words": (([],), "is not supported: use logit_bias to forbid single tokens"),
    "skip_special_tokens": ((True,), "false is not supported: special tokens never reach the text"),
    "prompt_logprobs": ((), "is not supported on this route: /v1/completions with echo and "
                            "logprobs scores a prompt"),
    "truncate_prompt_tokens": ((), "is not supported: a prompt over the context is a 400 that "
                                   "says by how much"),
}


def refuse_unoffered(body: dict, unoffered: dict):
    """A 400 for the first field of `unoffered` (name -> (the values besides null that ask
    nothing, why not)) that asks for something."""
    for name, (ask_nothing, why) in unoffered.items():
        value = body.get(name)
        if value is None or any(type(value) is type(a) and value == a for a in ask_nothing):
            continue
        raise InvalidRequest(f"{name} {why}", param=name)


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} -> ((id, bias), ...). Keys are
    decimal ids ("7", not " 7" or "1_0"); two keys of one id ("7", "07"): the last wins, as
    in vLLM's dict, so no token gets more than 100."""
    given = get(body, "logit_bias", (dict,), "an object mapping token ids to biases", {})
    biases: dict[int, float] = {}
    for key, bias in given.items():
        check(re.fullmatch(r"[0-9]{1,9}", key) is not None, "logit_bias",
              f"keys must be token ids (decimal digits), got {key!r}")
        check(isinstance(bias, NUMBER) and not isinstance(bias, bool)
              and -100 <= _as_float(bias) <= 100, "logit_bias",
              f"values must be numbers between -100 and 100, got {bias!r} for {key!r}")
        biases[int(key)] = float(bias)
    return tuple(biases.items())


def check_for_model(sampling: Sampling, vocab: int, chat_stops: frozenset[int], max_tokens: int,
                    grammar) -> None:
    """The fields that name token ids or counts, against the model's vocabulary, its chat
    format's stop ids, the reply's max_tokens and its grammar (None: none): InvalidRequest
    naming the field."""
    for name, ids in (("logit_bias", [t for t, _ in sampling.logit_bias]),
                      ("stop_token_ids", sampling.stop_token_ids),
                      ("allowed_token_ids", sampling.allowed_token_ids)):
        check_in_vocab(name, ids, vocab)
    if sampling.min_tokens > max_tokens:
        raise InvalidRequest(f"min_tokens ({sampling.min_tokens}) must not exceed the tokens "
                             f"this reply may have ({max_tokens}: max_tokens, else the rest of "
                             "the context)", param="min_tokens")
    stops = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else set(chat_stops))
    if sampling.min_tokens and sampling.allowed_token_ids and set(sampling.allowed_token_ids) <= stops:
        raise InvalidRequest("allowed_token_ids holds only stop tokens, which min_tokens holds "
                             "back: no token could be drawn", param="allowed_token_ids")
    if sampling.allowed_token_ids and grammar is not None:
        raise InvalidRequest("allowed_token_ids cannot be combined with tools or a constrained "
                             "output: their grammar may need a token it leaves out",
                             param="allowed_token_ids")
    if sampling.min_tokens and grammar is not None and grammar.is_masking:
        raise InvalidRequest("min_tokens cannot be combined with an output constrained from its "
                             "first token (response_format, structured outputs or a forced tool "
                             "call): the constraint decides where the output ends",
                             param="min_tokens")
