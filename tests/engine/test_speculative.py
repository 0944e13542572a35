"""Speculative decoding from the context (engine/speculate.py): with drafts verified, the
default model gives exactly the tokens and logprobs of plain decoding, greedy and seeded,
alone and batched, on both decode GEMVs; drafts are made and accepted where the text repeats;
the drafter and the draft length behave as documented."""
import pytest

from tests.engine.batching_helpers import RunningEngine, both_ways, collect as collect_ids
from engined.engine import speculate
from engined.engine.lookup import PromptLookup

DRAFTED = "kimi_engine_spec_draft_tokens_total"
ACCEPTED = "kimi_engine_spec_accepted_tokens_total"
CODE = ("def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")


@pytest.fixture
def prior_cost(monkeypatch):
    """Step costs fixed at the prior: which drafts are tried, and so how many stand, then
    follow the tokens alone. Measured costs follow the host: on a busy 2-core EPYC the draft
    length once tried only drafts whose first token fell, and none of 45 stood."""
    monkeypatch.setattr(speculate.StepCost, "relative",
                        property(lambda cost: speculate.prior_cost()))


def edit_prompt(tokenizer) -> list[int]:
    """A prompt whose answer repeats it: the model copies, so drafts from the prompt stand."""
    text = ("Copy this code exactly, then stop.\n\n" + CODE + "\nCopy:\n\n" + CODE +
            "\nCopy:\n\n")
    return tokenizer.encode(text)


def run(engine, prompt, max_tokens, **params):
    return engine.submit(prompt, max_tokens, num_top_logprobs=0, **params)


def collect(seq):
    return collect_ids(seq, logprobs=True)


@pytest.mark.parametrize("gemv", ["default", "w4a16_gemv", "w4a8_gemv"])
def test_greedy_and_seeded_tokens_are_those_of_plain_decoding(llama, gemv, prior_cost):
    model, chosen = llama.model, llama.model.decode_gemv
    if gemv != "default":
        model.select_decode_gemv(gemv)
    try:
        prompt = edit_prompt(llama.tokenizer)
        off, on, (drafted, accepted) = both_ways(model, [(prompt, 48, {"temperature": 0})])
    finally:
        model.select_decode_gemv(chosen)
    assert on == off
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    print(f"{gemv}: {accepted:.0f} of {drafted:.0f} drafted tokens accepted")


def test_a_batch_of_greedy_and_sampled_requests_matches_plain_decoding(llama, prior_cost):
    prompt = edit_prompt(llama.tokenizer)
    prose = llama.tokenizer.encode("Write two sentences about the sea.\n")
    requests = [(prompt, 40, {"temperature": 0}),
                (prompt, 40, {"temperature": 0.7, "seed": 11}),
                (prose, 24, {"temperature": 0.9, "top_p": 0.9, "seed": 3}),
                (prompt[:-7], 30, {"temperature": 0})]
    off, on, (drafted, accepted) = both_ways(llama.model, requests)
    assert on == off
    assert accepted > 0


def test_constrained_requests_speculate_and_keep_their_tokens(llama, prior_cost):
    """A JSON schema whose reply repeats, and a lazy tool grammar woken inside copied text
    (drafts stop before the opener; after it, each verify row is masked for its position):
    greedy and seeded, batched, the tokens and logprobs of plain decoding."""
    from engined.grammar.compile import Compiler
    from engined.grammar.matcher import GrammarMatcher
    compiler = Compiler(llama.tokenizer, llama.chat.stop_token_ids, log=lambda line: None)
    schema = {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}}},
              "required": ["steps"]}
    call = '<tool_call>\n{"name": "area", "arguments": {"width": 2, "height": 3}}\n</tool_call>\n'
    tokenizer = llama.tokenizer
    json_prompt = tokenizer.encode("List the steps to bake bread as JSON.\n")
    copy_prompt = tokenizer.encode("Copy this exactly, then stop.\n\n" + call + "Copy:\n" + call
                                   + "Copy:\n")

    def requests():  # fresh matchers per run
        source, trigger = llama.chat.tool_grammar(
            [{"type": "function", "function": {"name": "area", "parameters": {"type": "object"}}}], "", True)
        return [(json_prompt, 64, {"temperature": 0, "grammar": GrammarMatcher(
                    compiler.json_schema(schema), compiler.ll, closers=compiler.closers, budget=64)}),
                (json_prompt, 48, {"temperature": 0.8, "seed": 5, "grammar": GrammarMatcher(
                    compiler.json_schema(schema), compiler.ll, closers=compiler.closers, budget=48)}),
                (copy_prompt, 40, {"temperature": 0, "grammar": GrammarMatcher(
                    compiler.lark(source), compiler.ll, trigger, closers=compiler.closers,
                    budget=40)})]

    results = []
    for speculative in (False, True):
        with RunningEngine(llama.model, speculative=speculative, prefix_cache_bytes=0) as engine:
            seqs = [run(engine, p, n, **params) for p, n, params in requests()]
            results.append([collect(s) for s in seqs])
            accepted = engine.value(ACCEPTED)
    assert results[1] == results[0]
    assert accepted > 0
    assert "<tool_call>" in tokenizer.decode([t for t, _ in results[0][2]])


def test_a_request_can_turn_speculation_off(llama):
    prompt = edit_prompt(llama.tokenizer)
    with RunningEngine(llama.model, prefix_cache_bytes=0) as engine:
        collect(run(engine, prompt, 24, temperature=0, speculative=False))
        assert engine.value(DRAFTED) == 0
        collect(run(engine, prompt, 24, temperature=0))
        assert engine.value(DRAFTED) > 0


LINE = (0.0, *(1 + 0.25 * r for r in range(speculate.K_MAX + 1)))  # a row: 1/4 of a step
CHEAP = (0.0, *(1 + 0.1 * r for r in range(speculate.K_MAX + 1)))


def test_the_draft_length_follows_what_drafts_behind_such_a_match_did():
    """The priors: the longer the match, the more drafts, and none for a one-token one; a
    match whose drafts kept standing grows, one whose drafts kept failing rests, then probes
    with one."""
    length = speculate.DraftLength()
    assert length.choose(32, 7, LINE) > length.choose(2, 7, LINE) > length.choose(1, 7, LINE) == 0
    assert length.choose(32, 7, CHEAP) == 7
    assert length.choose(32, 3, CHEAP) == 3                # no more than the lookup found
    before = length.choose(2, 7, LINE)
    for _ in range(12):                                    # two-token matches copied well here
        length.choose(2, 7, LINE)
        length.verified(4, 4)
    assert length.choose(2, 7, LINE) > before
    length.choose(20, 7, LINE)
    for _ in range(24):                                    # long matches failed at once
        length.verified(1, 0)
    rests = [length.choose(20, 7, LINE) for _ in range(speculate.COOLDOWN + 1)]
    assert rests == [0] * speculate.COOLDOWN + [1]        # then one probe
    assert length.choose(3, 7, LINE) > 0                  # other matches keep their rates


def test_dearer_rows_draft_less():
    """The same rates under a flat cost up to 4 rows and a steep one past them."""
    length = speculate.DraftLength()
    steep = (0.0, 1.0, 1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0)
    assert length.choose(3, 7, LINE) > 3
    assert length.choose(3, 7, steep) == 3


def test_a_sequence_learns_from_the_engines_counts_and_adds_its_own():
    engine = speculate.Acceptance()
    first = speculate.DraftLength(engine)
    for _ in range(40):
        first.choose(1, 7, LINE)
        first.verified(7, 7)                               # one-token matches that copied
    second = speculate.DraftLength(engine)                 # a later request starts from them
    assert second.choose(1, 7, LINE) == 7
    assert speculate.DraftLength().choose(1, 7, LINE) == 0  # an engine with no history: none
    for _ in range(24):
        second.choose(1, 7, LINE)
        second.verified(1, 0)
    assert second.choose(1, 7, LINE) == 0                  # its own failures outweigh them
    assert speculate.DraftLength(engine).choose(1, 7, LINE) > 0


def test_step_cost_per_row_count_through_a_busy_host():
    cost = speculate.StepCost()
    for rows in (1, 2, 4, 8) * 4:
        cost.samples.append((rows, 0.006 + 0.002 * rows))
    for rows in (1, 2, 4, 8):  # one step each slowed by other work
        cost.samples.append((rows, 0.1))
    assert cost.relative == pytest.approx((0.0, *((0.006 + 0.002 * r) / 0.008 for r in range(1, 9))))
    for _ in range(3):                                     # 3 rows measured dearer than the line
        cost.samples.append((3, 0.02))
    assert cost.relative[3] == pytest.approx(0.02 / 0.008)
    assert cost.relative[4] == cost.relative[3]            # never cheaper with more rows
    assert speculate.StepCost().relative == speculate.prior_cost()


def test_rows_measured_free_stay_free():
    """A GPU step whose extra rows cost nothing (a line that does not rise) keeps what was
    measured, rather than the prior's dear rows."""
    cost = speculate.StepCost()
    for rows in (1, 2, 4, 8) * 3:
        cost.samples.append((rows, 0.004 - 0.0001 * rows))      # noise: more rows, less time
    assert cost.relative[1:] == pytest.approx([1.0] * (speculate.K_MAX + 1))


def test_a_draft_that_ends_the_request_counts_as_accepted(llama):
    """The draw at a draft's place equals it and is a stop token: the draft stood."""
    from tests.engine.batching_helpers import NullDecoder
    from engined.engine.sequence import SamplingParams, Sequence
    import torch
    engine = RunningEngine(llama.model, prefix_cache_bytes=0).engine  # not started: one call
    seq = Sequence([1, 2, 3], SamplingParams(16, temperature=0, stop_token_ids=frozenset({7})),
                   NullDecoder())
    seq.spec = (PromptLookup(seq.prompt_ids), speculate.DraftLength())
    seq.draft = [6, 7, 8]
    engine._append_drawn(seq, torch.zeros(4, 10), 0, [6, 7, 9, 9])
    assert seq.output_ids == [6, 7] and seq.finish_reason == "stop"
    assert (seq.spec[1].num_drafted, seq.spec[1].num_accepted) == (3, 2)


def test_the_response_carries_vllms_spec_metrics_when_asked(llama):
    """With spec_decode_metrics, the usage also counts the accepted and rejected drafts, as
    OpenAI's Predicted Outputs do (completion_tokens_details); without it, usage is plain."""
    from tests.support.engine import InProcessEngine, metric, post
    body = {"messages": [{"role": "user", "content": "Repeat exactly:\n" + CODE * 2}],
            "max_tokens": 40, "temperature": 0, "spec_decode_metrics": True}
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=4096) as engine:
        reply = post(engine.sock, "/v1/chat/completions", body).json()
        drafted, accepted = metric(engine.sock, DRAFTED), metric(engine.sock, ACCEPTED)
        plain = post(engine.sock, "/v1/chat/completions", {**body, "speculative": False}).json()
        asked_not = post(engine.sock, "/v1/chat/completions",
                         {k: v for k, v in body.items() if k != "spec_decode_metrics"}).json()
    spec = reply["metrics"]["speculative_decoding"]
    assert (spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]) == (drafted, accepted)
    assert drafted > 0 and spec["num_spec_steps"] > 0
    assert spec["mean_acceptance_length"] == 1 + accepted / spec["num_spec_steps"]
    assert reply["usage"]["completion_tokens_details"] == {
        "accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}
    assert plain["metrics"]["speculative_decoding"]["num_draft_tokens"] == 0
    assert plain["usage"]["completion_tokens_details"] == {
        "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    assert "metrics" not in asked_not
    assert set(asked_not["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert plain["choices"][0]["message"] == reply["choices"][0]["message"]


def test_the_streams_usage_chunk_carries_the_draft_counts_when_asked(llama):
    """Chat and completions alike: the final usage chunk (stream_options.include_usage) has
    the same completion_tokens_details and metrics as the request's counters."""
    from tests.support.engine import InProcessEngine, metric, stream
    prompt = "Repeat exactly:\n" + CODE * 2
    asked = {"max_tokens": 40, "temperature": 0, "stream": True, "spec_decode_metrics": True,
             "stream_options": {"include_usage": True}}
    routes = [("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}),
              ("/v1/completions", {"prompt": prompt + "\n" + CODE})]
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=4096) as engine:
        for path, body in routes:
            before = metric(engine.sock, DRAFTED), metric(engine.sock, ACCEPTED)
            chunks = stream(engine.sock, path, {**body, **asked})
            drafted = metric(engine.sock, DRAFTED) - before[0]
            accepted = metric(engine.sock, ACCEPTED) - before[1]
            assert chunks[-1] == "[DONE]" and chunks[-2]["choices"] == [], path
            usage, spec = chunks[-2]["usage"], chunks[-2]["metrics"]["speculative_decoding"]
            assert drafted > 0, path
            assert usage["completion_tokens_details"] == {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": drafted - accepted}, path
            assert (spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]) == (
                drafted, accepted), path
            assert all("usage" not in c for c in chunks[:-2]), path


def test_the_log_line_counts_the_accepted_and_drafted_tokens(llama):
    """kimi-engine(8): spec=ACCEPTED/DRAFTED on the request's line when it drafted, the
    same counts as its response; nothing for a request that did not speculate."""
    from tests.support.engine import InProcessEngine, eventually, post
    body = {"messages": [{"role": "user", "content": "Repeat exactly:\n" + CODE * 2}],
            "max_tokens": 40, "temperature": 0, "spec_decode_metrics": True}
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=4096) as engine:
        reply = post(engine.sock, "/v1/chat/completions", body,
                     headers={"x-request-id": "spec-on"}).json()
        post(engine.sock, "/v1/chat/completions", {**body, "speculative": False},
             headers={"x-request-id": "spec-off"})
        log = engine.dir / "engine.log"

        def lines():
            text = log.read_text() if log.exists() else ""
            return {line.split("request_id=")[1].split()[0]: line
                    for line in text.splitlines() if "request_id=spec-" in line}
        assert eventually(lambda: len(lines()) == 2), log.read_text()
        on, off = lines()["spec-on"], lines()["spec-off"]
    spec = reply["metrics"]["speculative_decoding"]
    assert spec["num_draft_tokens"] > 0
    assert f"spec={spec['num_accepted_draft_tokens']}/{spec['num_draft_tokens']}" in on.split(), on
    assert " spec=" not in off, off


def test_edit_turns_bench_reports_the_requests_acceptance_and_draft_length(llama, monkeypatch):
    """bench/edit_turns.py reads each streamed turn's own drafted, accepted and verifying-step
    counts from its usage chunk (the issue asks for the acceptance rate and the draft length),
    the same counts the engine's counters add up."""
    import importlib.util
    import pathlib
    import sys
    from tests.support.engine import InProcessEngine, metric
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench"
    monkeypatch.setattr(sys, "path", [str(bench), *sys.path])
    spec = importlib.util.spec_from_file_location("bench_edit_turns", bench / "edit_turns.py")
    edit_turns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(edit_turns)
    messages = [{"role": "user", "content": "Repeat exactly:\n" + CODE * 2}]
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=4096) as engine:
        ids, seconds, counts = edit_turns.stream_turn(engine.sock, messages, 40)
        drafted, accepted = metric(engine.sock, DRAFTED), metric(engine.sock, ACCEPTED)
    assert len(ids) == 40 and seconds > 0
    assert (counts["num_draft_tokens"], counts["num_accepted_draft_tokens"]) == (drafted, accepted)
    steps = counts["num_spec_steps"]
    assert 0 < steps < len(ids) and drafted >= steps
    turn = {"ids": ids, "tok_s": 1.0, "drafted": drafted, "accepted": accepted,
            "verify_steps": steps}
    summary = edit_turns.summarize([({**turn, "drafted": 0}, turn)])
    assert summary["draft_length"] == drafted / steps and summary["verify_steps"] == steps
    assert summary["acceptance"] == accepted / drafted


def test_a_steps_accepted_drafts_stream_as_one_chunk(llama):
    """The tokens a verify step accepts reach the client in one SSE chunk (one write), with
    their ids and logprobs, chat and completions alike; the streams join to the whole reply.
    Before, each token was a chunk and a write of its own, on an HTTP thread that shares the
    cores with the model."""
    from tests.support.engine import InProcessEngine, post, stream
    prompt = "Repeat exactly:\n" + CODE * 2
    chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 40,
            "temperature": 0, "return_token_ids": True, "logprobs": True, "top_logprobs": 1}
    text = {"prompt": prompt + "\n" + CODE, "max_tokens": 40, "temperature": 0,
            "return_token_ids": True, "logprobs": 1}
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=4096) as engine:
        whole = post(engine.sock, "/v1/chat/completions", chat).json()["choices"][0]
        chunks = [c["choices"][0] for c in stream(engine.sock, "/v1/chat/completions",
                                                  {**chat, "stream": True})[:-1] if c["choices"]]
        whole_text = post(engine.sock, "/v1/completions", text).json()["choices"][0]
        text_chunks = [c["choices"][0] for c in stream(engine.sock, "/v1/completions",
                                                       {**text, "stream": True})[:-1]]
    assert max(len(c.get("token_ids", [])) for c in chunks) > 1
    assert [t for c in chunks for t in c.get("token_ids", [])] == whole["token_ids"]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == whole["message"]["content"]
    for c in chunks[1:-1]:  # a content chunk's logprobs: one entry per token it carries
        assert len(c["logprobs"]["content"]) == len(c["token_ids"]), c
    assert max(len(c["token_ids"]) for c in text_chunks) > 1
    assert [t for c in text_chunks for t in c["token_ids"]] == whole_text["token_ids"]
    assert "".join(c["text"] for c in text_chunks) == whole_text["text"]
    offsets = [o for c in text_chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert offsets == whole_text["logprobs"]["text_offset"]


def test_a_prediction_drafts_the_reply_and_changes_no_token(llama, prior_cost):
    """The reply is not in the prompt, so the context drafts little; predicted, its drafts
    stand. A prediction of another shape is a 400 naming it."""
    from tests.support.engine import InProcessEngine, post
    body = {"messages": [{"role": "user", "content": "Write a short poem about the sea."}],
            "max_tokens": 48, "temperature": 0, "spec_decode_metrics": True}
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=4096) as engine:
        plain = post(engine.sock, "/v1/chat/completions", body).json()
        text = plain["choices"][0]["message"]["content"]
        parts = [{"type": "text", "text": text[:20]}, {"type": "text", "text": text[20:]}]
        predicted = [post(engine.sock, "/v1/chat/completions",
                          {**body, "prediction": {"type": "content", "content": content}}).json()
                     for content in (text, parts)]
        bad = [post(engine.sock, "/v1/chat/completions", {**body, "prediction": value})
               for value in ("text", {"type": "content", "content": 3}, {"type": "file", "content": "x"})]
    accepted = [r["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] for r in (plain, *predicted)]
    print("accepted drafts, plain and predicted twice:", accepted, "of", plain["usage"]["completion_tokens"])
    assert all(r["choices"][0]["message"] == plain["choices"][0]["message"] for r in predicted)
    assert min(accepted[1:]) >= max(3 * accepted[0], plain["usage"]["completion_tokens"] // 2), accepted
    assert all(r.status == 400 and r.json()["error"]["param"] == "prediction" for r in bad)
