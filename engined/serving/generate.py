"""The two generating routes, run on HTTP threads: validate, template, tokenize, submit a
Sequence, then turn its events into a JSON body or an SSE stream.

A client that goes away is noticed between events (a failed write, or EOF seen by a
socket peek) and its sequence is cancelled, which the model loop honours next step.
"""
import queue
import time
from dataclasses import dataclass

from engined.serving import parse as api
from engined.chat.messages import forced_tool, normalize_tools
from engined.chat.output import ContentDelta, OutputParser
from engined.errors import EngineError, InvalidRequest
from engined.serving.bodies import (DONE, LogprobFormat, Shaper, chat_finish_reason, chat_message,
                               delta_dict, merge_deltas, sse, usage)
from engined.engine.sequence import (ErrorEvent, FinishEvent, PromptLogprobsEvent, SamplingParams,
                              Sequence, TokenEvent)

LIVENESS_POLL_S = 0.05


class ClientGone(Exception):
    """The client closed its connection; its generation was cancelled."""


@dataclass
class Served:
    """What the routes need: the model loop and the text side of the loaded model."""
    engine: object
    tokenizer: object
    chat: object
    model_id: str
    max_context: int
    decoder_factory: object  # tokenizer -> IncrementalDecoder
    created: int = 0  # unix time the model was loaded

    @property
    def logprob_format(self) -> LogprobFormat:
        return LogprobFormat(self.tokenizer)


def submit(served: Served, ex, prompt_ids: list[int], max_tokens: int, sampling: api.Sampling,
           num_top: int | None, is_prompt_logprobs: bool = False) -> Sequence:
    stop_ids = frozenset() if sampling.ignore_eos else served.chat.stop_token_ids
    stops = sampling.stop + (() if sampling.ignore_eos else tuple(served.chat.stop_strings))
    params = SamplingParams(max_tokens, sampling.temperature, sampling.top_p, sampling.top_k,
                            sampling.seed, stops, stop_ids, num_top, is_prompt_logprobs)
    seq = Sequence(prompt_ids, params, served.decoder_factory(served.tokenizer), ex.request_id)
    served.engine.submit(seq)
    ex.stats["seq"] = seq
    return seq


def events(seq: Sequence, ex):
    """Yield the sequence's events up to its FinishEvent; ErrorEvent raises its error."""
    last_check = time.monotonic()
    while True:
        try:
            event = seq.events.get(timeout=LIVENESS_POLL_S)
        except queue.Empty:
            event = None
        if time.monotonic() - last_check >= LIVENESS_POLL_S:
            last_check = time.monotonic()
            if not ex.is_client_alive():
                seq.cancel()
                raise ClientGone()
        if event is None:
            continue
        if isinstance(event, ErrorEvent):
            raise event.error
        yield event
        if isinstance(event, FinishEvent):
            return


def start_stream(seq: Sequence, ex, text: str):
    try:
        ex.start_stream(text)
    except OSError:
        seq.cancel()
        raise ClientGone() from None


def send_events(seq: Sequence, ex, text: str, last: bool = False):
    """A write that fails means the client is gone: cancel the generation."""
    try:
        ex.end_stream(text) if last else ex.send_event(text)
    except OSError:
        seq.cancel()
        raise ClientGone() from None


# -- POST /v1/chat/completions -------------------------------------------------------------
def new_output_parser(chat, is_tools: bool, prompt: str):
    """The chat format's own parser (e.g. Kimi K2's tool-call tokens), else the hermes one.
    A generation prompt that opens <think> makes the output start as reasoning."""
    in_reasoning = prompt.rstrip().endswith("<think>")
    make = getattr(chat, "output_parser", None) or OutputParser
    return make(is_tools, in_reasoning)


def chat_completions(served: Served, ex):
    req = api.parse_chat(ex.json_body())
    prompt = served.chat.render(req.messages, req.tools, True, req.tool_choice)
    prompt_ids = served.tokenizer.encode(prompt)
    max_tokens = api.fit_context(len(prompt_ids), req.max_tokens, served.max_context)
    is_tools = forced_tool(req.tool_choice, normalize_tools(req.tools)) is not None
    seq = submit(served, ex, prompt_ids, max_tokens, req.sampling, req.num_top_logprobs)
    parser = new_output_parser(served.chat, is_tools, prompt)
    shaper = Shaper(served.model_id, "chatcmpl")
    lp = served.logprob_format if req.num_top_logprobs is not None else None
    if req.stream:
        return _stream_chat(seq, ex, parser, shaper, lp, req)
    deltas, logprobs = [], [] if lp else None
    for event in events(seq, ex):
        deltas += parser.feed(event.text)
        if isinstance(event, TokenEvent) and lp and event.logprob:
            logprobs.append(lp.chat_entry(event.logprob))
    deltas += parser.finish()
    content, reasoning = merge_deltas(deltas)
    finish = chat_finish_reason(event.reason, parser.tool_calls)
    return shaper.chat_response(chat_message(content, reasoning, parser.tool_calls), finish,
                                logprobs, event.num_prompt_tokens, event.num_completion_tokens,
                                user_stop(event, req.sampling))


def user_stop(event: FinishEvent, sampling: api.Sampling) -> str | None:
    """The request's own stop string that ended the text (not the template's end markers)."""
    return event.stop_string if event.stop_string in sampling.stop else None


def _stream_chat(seq, ex, parser, shaper, lp, req):
    start_stream(seq, ex, sse(shaper.chat_chunk({"role": "assistant", "content": ""})))
    pending = []  # logprob entries not yet attached to a chunk
    try:
        for event in events(seq, ex):
            if isinstance(event, TokenEvent) and lp and event.logprob:
                pending.append(lp.chat_entry(event.logprob))
            deltas = parser.feed(event.text)
            if isinstance(event, FinishEvent):
                deltas += parser.finish()
            for delta in deltas:
                if isinstance(delta, ContentDelta) and not delta.text:
                    continue
                chunk = shaper.chat_chunk(delta_dict(delta), logprobs=pending if lp else None)
                send_events(seq, ex, sse(chunk))
                pending = []
        finish = chat_finish_reason(event.reason, parser.tool_calls)
        tail = sse(shaper.chat_chunk({}, finish, logprobs=pending if pending else None,
                                     stop_reason=user_stop(event, req.sampling)))
        if req.include_usage:
            tail += sse(shaper.usage_chunk("chat.completion.chunk", event.num_prompt_tokens,
                                           event.num_completion_tokens))
        send_events(seq, ex, tail + DONE, last=True)
    except EngineError as exc:  # headers are gone: the error becomes an event
        send_events(seq, ex, sse(exc.body()) + DONE, last=True)
        ex.status = exc.status


# -- POST /v1/completions ------------------------------------------------------------------
def completions(served: Served, ex):
    req = api.parse_completion(ex.json_body())
    tokenizer = served.tokenizer
    if req.prompt_ids is not None:
        prompt_ids = api.parse_token_ids({"prompt": req.prompt_ids}, "prompt", tokenizer.vocab_size)
        prompt_text = tokenizer.decode(prompt_ids)
    else:
        prompt_text = req.prompt_text
        prompt_ids = tokenizer.encode(prompt_text, add_bos=tokenizer.add_bos_token)
    if not prompt_ids:
        raise InvalidRequest("prompt is empty", param="prompt")
    max_tokens = api.fit_context(len(prompt_ids), req.max_tokens, served.max_context)
    num_top = req.num_top_logprobs
    seq = submit(served, ex, prompt_ids, max_tokens, req.sampling, num_top,
                 is_prompt_logprobs=req.echo and num_top is not None)
    shaper, lp = Shaper(served.model_id, "cmpl"), served.logprob_format
    if req.stream:
        return _stream_completion(seq, ex, shaper, lp, req, prompt_text)
    text, entries = prompt_text if req.echo else "", []
    for event in events(seq, ex):
        if isinstance(event, PromptLogprobsEvent):
            entries += event.entries
            continue
        text += event.text
        if isinstance(event, TokenEvent) and event.logprob:
            entries.append(event.logprob)
    logprobs = lp.legacy(entries, 0) if num_top is not None else None
    return shaper.completion(shaper.text_choice(text, event.reason, logprobs),
                             usage(event.num_prompt_tokens, event.num_completion_tokens))


def _stream_completion(seq, ex, shaper, lp, req, prompt_text: str):
    is_logprobs = req.num_top_logprobs is not None
    echoed = prompt_text if req.echo else ""
    start_stream(seq, ex, sse(shaper.completion(shaper.text_choice(echoed, None, None))))
    prompt_offset, offset = 0, len(echoed)  # text_offset of the next prompt / generated token
    try:
        for event in events(seq, ex):
            if isinstance(event, FinishEvent):
                tail = sse(shaper.completion(shaper.text_choice(event.text, event.reason, None)))
                if req.include_usage:
                    tail += sse(shaper.usage_chunk("text_completion", event.num_prompt_tokens,
                                                   event.num_completion_tokens))
                return send_events(seq, ex, tail + DONE, last=True)
            if isinstance(event, PromptLogprobsEvent):  # echo: logprobs of the prompt tokens
                text, entries, start = "", list(event.entries), prompt_offset
                prompt_offset += sum(len(lp.token(e.token_id)[0]) for e in entries)
            else:
                text, entries, start = event.text, [event.logprob] if event.logprob else [], offset
                offset += len(text)
            logprobs = lp.legacy(entries, start) if is_logprobs and entries else None
            send_events(seq, ex, sse(shaper.completion(shaper.text_choice(text, None, logprobs))))
    except EngineError as exc:
        send_events(seq, ex, sse(exc.body()) + DONE, last=True)
        ex.status = exc.status
