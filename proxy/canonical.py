"""The canonical model every dialect lowers into and renders from.

Translation is always dialect -> canonical -> dialect. Two invariants hold everywhere:
tool-call `arguments` is the raw string the model produced (never parsed and re-dumped on
the way back to the engine), and reasoning text is carried verbatim.

Parts:    Text | Image | ToolCall | ToolResult | Reasoning
Message:  role in system|user|assistant|tool, parts
Events:   StreamStart, ReasoningDelta, ReasoningEnd, TextDelta, ToolCallStart,
          ToolCallArgsDelta, ToolCallEnd (per index, possibly interleaved), UsageUpdate,
          StreamEnd (finish reason, stop_sequence, usage, response). The tool-call text
          parsers (proxy/toolcalls) speak the same events, plus ParseFailure, which the
          pipeline counts and never passes on to a dialect.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Union

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "stop_sequence", "error"]


# ---- content parts ---------------------------------------------------------------------
@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Image:
    media_type: str
    data: str = ""          # base64 payload when not a URL
    url: str | None = None  # http(s) URL, when the client gave one

    def as_url(self) -> str:
        return self.url if self.url is not None else f"data:{self.media_type};base64,{self.data}"


def left_out(kind: str, detail: str = "", name: str = "") -> str:
    """The text that stands in the prompt for content the model cannot read (a PDF, an unknown
    block, an image for a text-only upstream): the model learns it was there and can say so,
    where a silent drop left it answering as if nothing had been sent, and a 400 would wedge
    an agent whose history holds it. name: its title or file name, quoted."""
    named = " ".join(x for x in (kind, json.dumps(name, ensure_ascii=False) if name else "", detail) if x)
    return f"[{named}: left out, this model cannot read it]"


def without_images(messages: tuple["Message", ...]) -> tuple["Message", ...]:
    """The messages for a text-only upstream: each image is its left_out text."""
    def text_of(image: Image) -> Text:
        return Text(left_out("image", f"({image.media_type})" if image.url is None else "(a URL)"))

    def part(p):
        if isinstance(p, Image):
            return text_of(p)
        if isinstance(p, ToolResult) and p.images:
            notes = "\n".join(text_of(img).text for img in p.images)
            return dataclasses.replace(p, content=f"{p.content}\n{notes}" if p.content else notes, images=())
        return p
    return tuple(dataclasses.replace(m, parts=tuple(part(p) for p in m.parts)) for m in messages)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the model's raw argument string, byte for byte


@dataclass(frozen=True)
class ToolResult:
    tool_call_id: str
    content: str
    is_error: bool = False
    name: str | None = None
    images: tuple[Image, ...] = ()


@dataclass(frozen=True)
class Reasoning:
    text: str
    signature: str | None = None
    redacted: bool = False


Part = Union[Text, Image, ToolCall, ToolResult, Reasoning]


@dataclass(frozen=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
    name: str | None = None

    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, Text))

    def of(self, kind: type) -> list:
        return [p for p in self.parts if isinstance(p, kind)]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: str = "function"  # "function" | "custom" (freeform input, one string argument)
    namespace: str | None = None  # Responses `namespace` tools: the group it came from
    # where the client sent this schema ("tools[3].input_schema"), to name it in an upstream error
    source: str | None = field(default=None, compare=False)


# ---- request ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: Any = None          # already in OpenAI Chat form, or None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool | None = None  # Chat: stream_options.include_usage (None = unset)
    continuous_usage: bool = False     # Chat: vLLM's continuous_usage_stats (with include_usage)
    reasoning_effort: str | None = None
    thinking_enabled: bool | None = None  # None = the client did not say
    is_reasoning_withheld: bool = False   # Anthropic thinking.display "omitted": signature only
    parallel_tool_calls: bool | None = None
    metadata: dict = field(default_factory=dict)
    passthrough: dict = field(default_factory=dict)  # unknown top-level keys for the engine
    previous_response_id: str | None = None  # Responses
    store: bool | None = None                 # Responses
    truncation: str | None = None             # Responses: "auto" drops turns from the middle to fit
    dropped_tools: tuple[str, ...] = ()       # hosted tools the engine cannot run, by type
    # (upstream field, the client's field) for fields the dialect renamed, e.g.
    # ("response_format.json_schema.schema", "output_format.schema"): upstream errors name the client's
    client_fields: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def replace(self, **changes) -> "Request":
        return dataclasses.replace(self, **changes)


# ---- usage and response ----------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0

    def merged(self, other: "Usage") -> "Usage":
        """Field by field; a later non-zero value wins."""
        pick = lambda a, b: b if b else a  # noqa: E731
        return Usage(*(pick(getattr(self, f.name), getattr(other, f.name))
                       for f in dataclasses.fields(Usage)))


@dataclass(frozen=True)
class Response:
    id: str
    model: str
    parts: tuple[Part, ...]
    finish_reason: FinishReason = "stop"
    stop_sequence: str | None = None
    usage: Usage = Usage()
    upstream_message: dict | None = None  # the exact assistant message to echo next turn
    logprobs: tuple | None = None         # OpenAI `logprobs.content` entries, when asked for

    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, Text))

    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    def reasoning(self) -> list[Reasoning]:
        return [p for p in self.parts if isinstance(p, Reasoning)]


# ---- stream events ---------------------------------------------------------------------
@dataclass(frozen=True)
class StreamStart:
    id: str
    model: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ReasoningEnd:
    text: str                 # this segment's full reasoning
    signature: str | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ParseFailure:
    reason: str
    raw: str  # the call's source text; the parser shows a readable TextDelta of it too


@dataclass(frozen=True)
class LogprobsDelta:
    content: tuple  # OpenAI `logprobs.content` entries for the tokens just streamed


@dataclass(frozen=True)
class UsageUpdate:
    usage: Usage


@dataclass(frozen=True)
class StreamEnd:
    finish_reason: FinishReason
    usage: Usage
    response: Response
    stop_sequence: str | None = None


Event = Union[StreamStart, ReasoningDelta, ReasoningEnd, TextDelta, ToolCallStart,
              ToolCallArgsDelta, ToolCallEnd, ParseFailure, LogprobsDelta, UsageUpdate, StreamEnd]
