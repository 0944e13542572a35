"""The two generating routes, run on HTTP threads: validate, template, tokenize, submit a
Sequence, then turn its events into a JSON body or an SSE stream: a chunk for each batch
of events (event_stream.py), so the tokens of a step that accepted drafts go out together.

A client that goes away is noticed between events (a failed write, or EOF seen by a
socket peek) and its sequence is cancelled, which the model loop honours next step.
"""
import time
from dataclasses import dataclass

from engined.serving import parse as api
from engined.serving import structured
from engined.serving.event_stream import (LIVENESS_POLL_S, ClientGone, IdStream, event_batches,
                                          events, send_events, start_stream)
from engined.chat.errors import PromptTooLong
from engined.chat.messages import forced_tool, normalize_tools
from engined.chat.output import ContentDelta
from engined.errors import ContextLengthExceeded, EngineError, InvalidRequest, QueueTimeout
from engined.serving.bodies import (DONE, LogprobFormat, Shaper, chat_finish_reason, chat_message,
                               delta_dict, merge_adjacent, merge_deltas, sse, usage)
from engined.engine import speculate
from engined.engine.sequence import (FinishEvent, PromptLogprobsEvent, SamplingParams, Sequence,
                              TokenEvent)


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
    queue_timeout_s: float = 0.0  # longest wait to start (--queue-timeout-s); 0 = no limit
    grammar_compiler: object = None  # grammar.compile.Compiler, built on first use (structured.py)

    def logprob_format(self, token_ids: api.TokenIds = api.TokenIds()) -> LogprobFormat:
        return LogprobFormat(self.tokenizer, token_ids.is_logprob_ids)


def encode_prompt(served: Served, text: str, add_bos: bool = False) -> list[int]:
    """Token ids of a prompt that can fit the context; one that cannot is refused as soon as
    that is sure, without tokenizing all of it (a 16 MiB prompt: at once, from its size)."""
    try:
        return served.tokenizer.encode(text, add_bos=add_bos, limit=served.max_context)
    except PromptTooLong as exc:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {served.max_context} tokens. However, "
            f"your messages resulted in at least {exc.num_tokens} tokens. Please reduce the "
            "length of the messages.", param="messages") from None


def encode_prediction(served: Served, text: str) -> list[int]:
    """The prediction's tokens; one longer than the context cannot be the reply: refused."""
    if not text:
        return []
    try:
        return served.tokenizer.encode(text, allow_special=False, limit=served.max_context)
    except PromptTooLong:
        raise InvalidRequest(f"prediction is longer than the context ({served.max_context} "
                             "tokens): it cannot be the reply", param="prediction") from None


def submit(served: Served, ex, prompt_ids: list[int], max_tokens: int, sampling: api.Sampling,
           num_top: int | None, is_prompt_logprobs: bool = False, grammar=None) -> Sequence:
    api.check_for_model(sampling, served.tokenizer.vocab_size, served.chat.stop_token_ids,
                        max_tokens, grammar)
    stop_ids = frozenset(sampling.stop_token_ids) | (
        frozenset() if sampling.ignore_eos else served.chat.stop_token_ids)
    stops = sampling.stop + (() if sampling.ignore_eos else tuple(served.chat.stop_strings))
    params = SamplingParams(
        max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=sampling.top_k, seed=sampling.seed, stop=stops, stop_token_ids=stop_ids,
        num_top_logprobs=num_top, is_prompt_logprobs=is_prompt_logprobs,
        speculative=sampling.speculative, presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty, logit_bias=sampling.logit_bias,
        min_p=sampling.min_p, min_tokens=sampling.min_tokens,
        kept_stops=sampling.stop if sampling.include_stop else (),
        allowed_token_ids=frozenset(sampling.allowed_token_ids),
        prediction_ids=tuple(encode_prediction(served, sampling.prediction)))
    seq = Sequence(prompt_ids, params, served.decoder_factory(served.tokenizer), ex.request_id,
                   grammar=grammar)
    served.engine.submit(seq)  # a full queue raises QueueFull: 429
    ex.stats["seq"] = seq
    await_admission(served, seq, ex)
    return seq


def await_admission(served: Served, seq: Sequence, ex):
    """Wait until the model loop starts the sequence, before any header is sent, so a
    request that waits past --queue-timeout-s is taken off the queue and answered 503
    (streamed or not). A client that leaves meanwhile is dropped at once."""
    while not seq.wait_admitted(LIVENESS_POLL_S):
        if seq.is_finished:  # failed while queued (the engine stopped): events() says so
            return
        if not ex.is_client_alive():
            seq.cancel()
            raise ClientGone()
        waited = time.monotonic() - seq.arrival_time
        if (served.queue_timeout_s and waited > served.queue_timeout_s
                and served.engine.scheduler.withdraw(seq)):
            raise QueueTimeout(f"the request waited {waited:.0f} s in the engine's queue "
                               f"without starting (--queue-timeout-s "
                               f"{served.queue_timeout_s:g}); retry later")


# -- POST /v1/chat/completions -------------------------------------------------------------
def new_output_parser(chat, is_tools: bool, prompt: str):
    """The chat format's parser (Kimi K2's tool-call tokens, or the Jinja formats' hermes
    one). A generation prompt that opens <think> makes the output start as reasoning."""
    return chat.output_parser(is_tools, prompt.rstrip().endswith("<think>"))


def chat_completions(served: Served, ex):
    req = api.parse_chat(ex.json_body())
    prompt = served.chat.render(req.messages, req.tools, req.add_generation_prompt,
                                req.tool_choice, req.continue_final)
    prompt_ids = encode_prompt(served, prompt)
    max_tokens = api.fit_context(len(prompt_ids), req.max_tokens, served.max_context)
    tools = normalize_tools(req.tools)
    forced = forced_tool(req.tool_choice, tools)
    is_tools = forced is not None
    if req.continue_final and (req.constraint is not None or forced):
        raise InvalidRequest("continue_final_message cannot be combined with a constrained "
                             "output (response_format, structured outputs or a forced tool "
                             "call): the constraint would start after the text it continues",
                             param="continue_final_message")
    grammar = structured.request_grammar(served, req.constraint, max_tokens, tools, forced,
                                         req.is_parallel_tools)
    seq = submit(served, ex, prompt_ids, max_tokens, req.sampling, req.num_top_logprobs,
                 grammar=grammar)
    parser = new_output_parser(served.chat, is_tools, prompt)
    shaper = Shaper(served.model_id, "chatcmpl", len(prompt_ids) if req.continuous_usage else None)
    lp = served.logprob_format(req.token_ids) if req.num_top_logprobs is not None else None
    if req.stream:
        return _stream_chat(seq, ex, parser, shaper, lp, req, prompt_ids)
    deltas, logprobs = [], [] if lp else None
    for event in events(seq, ex):
        deltas += parser.feed(event.text)
        if isinstance(event, TokenEvent) and lp and event.logprob:
            logprobs.append(lp.chat_entry(event.logprob))
    deltas += parser.finish()
    content, reasoning = merge_deltas(deltas)
    finish = chat_finish_reason(event.reason, parser.tool_calls)
    body = shaper.chat_response(chat_message(content, reasoning, parser.tool_calls), finish,
                                logprobs, event.num_prompt_tokens, event.num_completion_tokens,
                                user_stop(event, req.sampling))
    if req.token_ids.is_returned:  # vLLM: prompt ids on the response, output ids per choice
        body["prompt_token_ids"] = prompt_ids
        body["choices"][0]["token_ids"] = list(event.token_ids)
    return with_spec_metrics(body, seq, req.sampling)


def with_spec_metrics(body: dict, seq, sampling: api.Sampling) -> dict:
    """With "spec_decode_metrics": true, the body that carries usage also carries this
    request's draft counts (read once the sequence has finished): in its usage, as OpenAI's
    Predicted Outputs count theirs, and as vLLM's metrics.speculative_decoding, which also
    has the verifying steps and the rates (bench/edit_turns.py reads them)."""
    if sampling.spec_metrics:
        spec = speculate.request_metrics(seq.spec[1] if seq.spec is not None else None)
        drafted, accepted = spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]
        body["usage"]["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted}
        body["metrics"] = {"speculative_decoding": spec}
    return body


def user_stop(event: FinishEvent, sampling: api.Sampling) -> str | None:
    """The request's own stop string that ended the text (not the template's end markers)."""
    return event.stop_string if event.stop_string in sampling.stop else None


def _stream_chat(seq, ex, parser, shaper, lp, req, prompt_ids):
    ids = IdStream(req.token_ids.is_returned)
    first = shaper.chat_chunk({"role": "assistant", "content": ""})
    if ids.is_on:
        first["prompt_token_ids"] = prompt_ids
    start_stream(seq, ex, sse(first))
    pending = []  # logprob entries not yet attached to a chunk
    try:
        for batch in event_batches(seq, ex):
            deltas = []
            for event in batch:
                ids.add(event)
                shaper.counted(event)
                if isinstance(event, TokenEvent) and lp and event.logprob:
                    pending.append(lp.chat_entry(event.logprob))
                deltas += parser.feed(event.text)
            if isinstance(event, FinishEvent):
                deltas += parser.finish()
            chunks = []
            for delta in merge_adjacent(deltas):
                if isinstance(delta, ContentDelta) and not delta.text:
                    continue
                chunk = shaper.chat_chunk(delta_dict(delta), logprobs=pending if lp else None)
                chunk["choices"][0].update(ids.take())
                chunks.append(sse(chunk))
                pending = []
            if chunks:
                send_events(seq, ex, "".join(chunks))
        finish = chat_finish_reason(event.reason, parser.tool_calls)
        last = shaper.chat_chunk({}, finish, logprobs=pending if pending else None,
                                 stop_reason=user_stop(event, req.sampling))
        last["choices"][0].update(ids.take(event))
        tail = sse(last)
        if req.include_usage:
            tail += sse(with_spec_metrics(shaper.usage_chunk(
                "chat.completion.chunk", event.num_prompt_tokens, event.num_completion_tokens),
                seq, req.sampling))
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
        prompt_ids = encode_prompt(served, prompt_text, add_bos=tokenizer.add_bos_token)
    if not prompt_ids:
        raise InvalidRequest("prompt is empty", param="prompt")
    max_tokens = api.fit_context(len(prompt_ids), req.max_tokens, served.max_context)
    num_top = req.num_top_logprobs
    seq = submit(served, ex, prompt_ids, max_tokens, req.sampling, num_top,
                 is_prompt_logprobs=req.echo and num_top is not None,
                 grammar=structured.request_grammar(served, req.constraint, max_tokens))
    shaper = Shaper(served.model_id, "cmpl", len(prompt_ids) if req.continuous_usage else None)
    lp = served.logprob_format(req.token_ids)
    if req.stream:
        return _stream_completion(seq, ex, shaper, lp, req, prompt_text, prompt_ids)
    text, entries = prompt_text if req.echo else "", []
    for event in events(seq, ex):
        if isinstance(event, PromptLogprobsEvent):
            entries += event.entries
            continue
        text += event.text
        if isinstance(event, TokenEvent) and event.logprob:
            entries.append(event.logprob)
    logprobs = lp.legacy(entries, 0) if num_top is not None else None
    choice = shaper.text_choice(text, event.reason, logprobs)
    if req.token_ids.is_returned:  # vLLM: both on the choice for completions
        choice.update(prompt_token_ids=prompt_ids, token_ids=list(event.token_ids))
    return with_spec_metrics(shaper.completion(
        choice, usage(event.num_prompt_tokens, event.num_completion_tokens)), seq, req.sampling)


def _stream_completion(seq, ex, shaper, lp, req, prompt_text: str, prompt_ids: list[int]):
    is_logprobs = req.num_top_logprobs is not None
    echoed = prompt_text if req.echo else ""
    ids = IdStream(req.token_ids.is_returned)
    first = shaper.text_choice(echoed, None, None)
    if ids.is_on:
        first.update(prompt_token_ids=prompt_ids, token_ids=[])
    start_stream(seq, ex, sse(shaper.completion(first)))
    prompt_offset, offset = 0, len(echoed)  # text_offset of the next prompt / generated token
    try:
        for batch in event_batches(seq, ex):
            chunks, tokens = [], [e for e in batch if isinstance(e, TokenEvent)]
            for event in batch:
                if isinstance(event, PromptLogprobsEvent):  # echo: logprobs of the prompt tokens
                    entries, start = list(event.entries), prompt_offset
                    prompt_offset += sum(len(lp.text(e.token_id)) for e in entries)
                    logprobs = lp.legacy(entries, start) if is_logprobs and entries else None
                    chunks.append(sse(shaper.completion({**shaper.text_choice("", None, logprobs),
                                                         **ids.take()})))
                ids.add(event)
                shaper.counted(event)
            if tokens:  # the batch's tokens in one chunk
                text = "".join(e.text for e in tokens)
                entries = [e.logprob for e in tokens if e.logprob]
                logprobs = lp.legacy(entries, offset) if is_logprobs and entries else None
                offset += len(text)
                chunks.append(sse(shaper.completion({**shaper.text_choice(text, None, logprobs),
                                                     **ids.take()})))
            event = batch[-1]
            if isinstance(event, FinishEvent):
                last = shaper.text_choice(event.text, event.reason, None)
                chunks.append(sse(shaper.completion({**last, **ids.take(event)})))
                if req.include_usage:
                    chunks.append(sse(with_spec_metrics(shaper.usage_chunk(
                        "text_completion", event.num_prompt_tokens,
                        event.num_completion_tokens), seq, req.sampling)))
                return send_events(seq, ex, "".join(chunks) + DONE, last=True)
            send_events(seq, ex, "".join(chunks))
    except EngineError as exc:
        send_events(seq, ex, sse(exc.body()) + DONE, last=True)
        ex.status = exc.status
