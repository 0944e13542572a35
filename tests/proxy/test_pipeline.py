"""Upstream chunks -> canonical events: the regressions protocols.md §9 pins, and more."""
from proxy import canonical as c
from proxy.pipeline import Options, Pipeline, chunks_from_json, one_call_at_a_time
from proxy.toolcalls import get_parser


def run(deltas, parser="passthrough", finish="stop", split_think=False, extra=None, stop=()):
    chunks = [{"id": "up", "choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({"id": "up", "choices": [{"index": 0, "delta": {}, "finish_reason": finish, **(extra or {})}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    opts = Options("client-model", get_parser(parser, None), split_think=split_think, stop=stop,
                   sign=lambda text: f"sig:{text}")
    return list(Pipeline(opts).run(chunks))


def call(i, id=None, name=None, args=None):
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    return {"tool_calls": [{"index": i, **({"id": id} if id else {}), "function": fn}]}


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_ids_names_and_fragments_of_native_calls():
    events = run([call(0, name="l"), call(0, name="s"), call(0, id="call_9", args='{"a"'),
                  call(0, name="ls", args=": 1}")], finish="tool_calls")
    starts, deltas, ends = of(events, c.ToolCallStart), of(events, c.ToolCallArgsDelta), of(events, c.ToolCallEnd)
    assert starts == [c.ToolCallStart(0, "call_9", "ls")]  # name announced whole, with the real id
    assert [d.text for d in deltas] == ['{"a"', ": 1}"]        # each fragment exactly once
    assert ends == [c.ToolCallEnd(0, "call_9", "ls", '{"a": 1}')]


def test_arguments_before_the_name_still_arrive():
    events = run([call(0, args='{"x":'), call(0, id="c", name="f", args="2}")])
    assert "".join(d.text for d in of(events, c.ToolCallArgsDelta)) == '{"x":2}'
    assert of(events, c.ToolCallEnd)[0].arguments == '{"x":2}'
    assert of(events, c.StreamEnd)[0].finish_reason == "tool_calls"


def test_repeated_full_name_is_not_doubled():
    events = run([call(0, id="c", name="ls", args=""), call(0, name="ls", args="{}")])
    assert of(events, c.ToolCallStart)[0].name == "ls" and of(events, c.ToolCallEnd)[0].name == "ls"


def test_index_less_calls_in_one_delta_stay_apart():
    events = run([{"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}},
                                  {"id": "b", "function": {"name": "g", "arguments": "[]"}}]}])
    assert [(e.index, e.name, e.arguments) for e in of(events, c.ToolCallEnd)] == [(0, "f", "{}"), (1, "g", "[]")]


def test_interleaved_calls_serialised_for_one_block_dialects():
    events = run([call(0, "a", "f", ""), call(1, "b", "g", ""), call(0, args='{"x"'), call(1, args='{"y"'),
                  call(0, args=":1}"), call(1, args=":2}")])
    live = [(type(e).__name__, e.index) for e in one_call_at_a_time(events)
            if isinstance(e, (c.ToolCallStart, c.ToolCallArgsDelta, c.ToolCallEnd))]
    first_end = live.index(("ToolCallEnd", 0))
    assert all(i == 0 for _k, i in live[:first_end + 1]) and all(i == 1 for _k, i in live[first_end + 1:])
    args = {i: "" for i in (0, 1)}
    for e in one_call_at_a_time(events):
        if isinstance(e, c.ToolCallArgsDelta):
            args[e.index] += e.text
    assert args == {0: '{"x":1}', 1: '{"y":2}'}


def test_reasoning_segments_close_before_text_and_tags_never_leak():
    events = run([{"content": "<th"}, {"content": "ink>plan"}, {"content": "</thi"}, {"content": "nk>Hi"},
                  {"reasoning_content": "more"}, {"content": "!"}], split_think=True)
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("ReasoningEnd") < kinds.index("TextDelta")
    assert "".join(e.text for e in of(events, c.TextDelta)) == "Hi!"
    ends = of(events, c.ReasoningEnd)
    assert [(e.text, e.signature) for e in ends] == [("plan", "sig:plan"), ("more", "sig:more")]
    response = of(events, c.StreamEnd)[0].response
    assert [p.text for p in response.reasoning()] == ["plan", "more"] and response.text() == "Hi!"


def test_stop_sequence_usage_and_identity():
    events = run([{"content": "a"}], extra={"stop_reason": "</x>"}, stop=("</x>",))
    end = of(events, c.StreamEnd)[0]
    assert (end.finish_reason, end.stop_sequence) == ("stop_sequence", "</x>")
    assert end.usage == c.Usage(3, 4) and events[0] == c.StreamStart("up", "client-model")
    assert of(run([{"content": "a"}], extra={"stop_reason": 7}, stop=("</x>",)), c.StreamEnd)[0].finish_reason == "stop"


def test_text_parsed_calls_upgrade_stop_to_tool_calls():
    text = '<tool_call>{"name": "f", "arguments": {"q": 1}}</tool_call>'
    events = run([{"content": text[:9]}, {"content": text[9:]}], parser="hermes")
    assert [e.name for e in of(events, c.ToolCallEnd)] == ["f"]
    assert of(events, c.StreamEnd)[0].finish_reason == "tool_calls"
    assert "".join(e.text for e in of(events, c.TextDelta)) == ""


def test_non_stream_json_becomes_the_same_events():
    body = {"id": "j", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "ok", "reasoning_content": "r",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    chunks = chunks_from_json(body)
    assert all(ch["id"] == "j" and ch["model"] == "m" for ch in chunks)  # identity on every chunk
    events = list(Pipeline(Options("cm", get_parser("passthrough"))).run(chunks))
    response = of(events, c.StreamEnd)[0].response
    assert (response.text(), response.reasoning()[0].text, response.tool_calls()[0].arguments) == ("ok", "r", "{}")
    assert response.upstream_message["tool_calls"][0]["id"] == "c1"


def test_text_tool_call_without_declared_tools_stays_text():
    """A client that declared no tools cannot run a call: the text is shown, not a tool_use."""
    failures = []
    chunks = [{"id": "up", "choices": [{"index": 0, "delta": {
        "content": '<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>'}}]},
        {"id": "up", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    opts = Options("m", get_parser("hermes", []), split_think=False, stop=(),
                   sign=lambda text: None, on_parse_failure=failures.append)
    events = list(Pipeline(opts).run(chunks))
    assert not of(events, c.ToolCallStart)
    assert "shell" in "".join(e.text for e in of(events, c.TextDelta))
    assert failures
