"""OpenAI-shaped response bodies and stream chunks (Chat Completions and legacy Completions).

Builders only: no I/O, no engine. `Shaper` stamps id / created / model on every object.
"""
import json
import time
import uuid

from engined.chat.output import ContentDelta, ReasoningDelta, ToolCallDelta
from engined.engine.sequence import FinishEvent, TokenEvent, TokenLogprob

DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage(num_prompt: int, num_completion: int) -> dict:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion}


def delta_dict(delta) -> dict:
    """A chat.output delta -> the `delta` object of a chat.completion.chunk."""
    if isinstance(delta, ContentDelta):
        return {"content": delta.text}
    if isinstance(delta, ReasoningDelta):
        return {"reasoning_content": delta.text}
    if isinstance(delta, ToolCallDelta):
        call = {"index": delta.index}
        if delta.id is not None:
            call.update(id=delta.id, type="function")
        function = {"arguments": delta.arguments}
        if delta.name is not None:
            function = {"name": delta.name, **function}
        return {"tool_calls": [{**call, "function": function}]}
    raise TypeError(f"unknown delta {delta!r}")


def merge_adjacent(deltas: list) -> list:
    """Runs of content, or of reasoning, as one delta each (a stream's chunk of several
    tokens); tool-call deltas as they are."""
    merged = []
    for delta in deltas:
        if merged and type(delta) is type(merged[-1]) and isinstance(delta, (ContentDelta, ReasoningDelta)):
            merged[-1] = type(delta)(merged[-1].text + delta.text)
        else:
            merged.append(delta)
    return merged


def merge_deltas(deltas: list) -> tuple[str, str]:
    """-> (content, reasoning) concatenated from a list of deltas."""
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    return content, reasoning


class LogprobFormat:
    """Token ids -> the strings and bytes OpenAI puts in logprobs."""

    def __init__(self, tokenizer, is_ids: bool = False):
        self.tokenizer = tokenizer
        self.is_ids = is_ids  # return_tokens_as_token_ids: "token_id:N", never ambiguous

    def text(self, token_id: int) -> str:
        """The token's own text (what text_offset counts)."""
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    def token(self, token_id: int) -> tuple[str, list[int]]:
        """The logprob entry's token string and bytes."""
        raw = self.tokenizer.token_bytes(token_id)
        text = f"token_id:{token_id}" if self.is_ids else raw.decode("utf-8", errors="replace")
        return text, list(raw)

    def chat_entry(self, lp: TokenLogprob) -> dict:
        text, raw = self.token(lp.token_id)
        top = []
        for token_id, value in lp.top:
            t, b = self.token(token_id)
            top.append({"token": t, "logprob": value, "bytes": b})
        return {"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top}

    def legacy(self, entries: list[TokenLogprob], text_start: int) -> dict:
        """vLLM / OpenAI legacy completions logprobs; text_offset counts from text_start."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = text_start
        for lp in entries:
            text, _ = self.token(lp.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append(
                {self.token(i)[0]: v for i, v in lp.top} if lp.logprob is not None else None)
            out["text_offset"].append(offset)
            offset += len(self.text(lp.token_id))
        return out


class Shaper:
    def __init__(self, model_id: str, prefix: str, running_prompt: int | None = None):
        """running_prompt: the prompt's tokens, for vLLM's continuous_usage_stats (every chunk
        carries the usage so far; count each generated token with `counted`)."""
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model_id
        self.running = None if running_prompt is None else [running_prompt, 0]

    def counted(self, event) -> None:
        if self.running is None:
            return
        if isinstance(event, TokenEvent):
            self.running[1] += 1
        elif isinstance(event, FinishEvent):  # a stop token counts but makes no TokenEvent
            self.running[1] = event.num_completion_tokens

    def _base(self, kind: str) -> dict:
        base = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
        if self.running is not None:  # a body's own final usage replaces it
            base["usage"] = usage(*self.running)
        return base

    # -- chat ------------------------------------------------------------------------------
    def chat_chunk(self, delta: dict, finish_reason: str | None = None,
                   logprobs: list | None = None, stop_reason: str | None = None) -> dict:
        choice = {"index": 0, "delta": delta,
                  "logprobs": {"content": logprobs} if logprobs is not None else None,
                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason  # vLLM's field: the request's stop string hit
        return {**self._base("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self, kind: str, num_prompt: int, num_completion: int) -> dict:
        return {**self._base(kind), "choices": [], "usage": usage(num_prompt, num_completion)}

    def chat_response(self, message: dict, finish_reason: str, logprobs: list | None,
                      num_prompt: int, num_completion: int, stop_reason: str | None = None) -> dict:
        choice = {"index": 0, "message": message,
                  "logprobs": {"content": logprobs} if logprobs is not None else None,
                  "finish_reason": finish_reason, "stop_reason": stop_reason}
        return {**self._base("chat.completion"), "choices": [choice],
                "usage": usage(num_prompt, num_completion)}

    # -- legacy completions ----------------------------------------------------------------
    def text_choice(self, text: str, finish_reason: str | None, logprobs: dict | None) -> dict:
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def completion(self, choice: dict, usage_: dict | None = None) -> dict:
        body = {**self._base("text_completion"), "choices": [choice]}
        if usage_ is not None:
            body["usage"] = usage_
        return body


def chat_message(content: str, reasoning: str, tool_calls: list[dict]) -> dict:
    """The assistant message: content null when there are tool calls and no text."""
    message = {"role": "assistant", "content": content if content or not tool_calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def chat_finish_reason(reason: str, tool_calls: list) -> str:
    return "tool_calls" if tool_calls and reason == "stop" else reason
