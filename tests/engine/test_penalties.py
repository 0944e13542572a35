"""logit_bias, presence_penalty, frequency_penalty and repetition_penalty (engine/penalties.py):
the adjusted logits against a plain per-token reference written here (vLLM's rules), and the
engine's greedy tokens against a plain decode loop that applies that reference, with
speculation off and on (a verify row's counts include the drafts before it). These fields
were silently ignored before: the engine's tokens did not change."""
import numpy as np
import pytest
import torch

from tests.engine.batching_helpers import RunningEngine, collect
from engined.engine import penalties, speculate
from engined.engine.sequence import SamplingParams, Sequence


def reference(logits: list[float], params: SamplingParams, prompt: list[int],
              history: list[int]) -> list[float]:
    """One row, token by token in float32: a stop token is -inf while the history is shorter
    than min_tokens; then the bias, the repetition rule on tokens of the prompt or the
    history, then frequency * count and presence in the history."""
    f32 = np.float32
    out = []
    for t, x in enumerate(logits):
        x = f32(x)
        if params.allowed_token_ids and t not in params.allowed_token_ids:
            x = f32(float("-inf"))
        if len(history) < params.min_tokens and t in params.stop_token_ids:
            x = f32(float("-inf"))
        for token, bias in params.logit_bias:
            if token == t:
                x = f32(x + f32(bias))
        if params.repetition_penalty != 1.0 and (t in prompt or t in history):
            r = f32(params.repetition_penalty)
            x = f32(x / r) if x > 0 else f32(x * r)
        count = history.count(t)
        if params.frequency_penalty:
            x = f32(x - f32(f32(params.frequency_penalty) * f32(count)))
        if params.presence_penalty:
            x = f32(x - f32(f32(params.presence_penalty) * f32(count > 0)))
        out.append(float(x))
    return out


PARAMS = [SamplingParams(8),
          SamplingParams(8, presence_penalty=0.7),
          SamplingParams(8, frequency_penalty=-0.3),
          SamplingParams(8, repetition_penalty=1.3),
          SamplingParams(8, logit_bias=((2, 5.0), (9, -100.0))),
          SamplingParams(8, presence_penalty=-1.1, frequency_penalty=0.45, repetition_penalty=0.8,
                         logit_bias=((0, 1.5),)),
          SamplingParams(8, min_tokens=7, stop_token_ids=frozenset({4, 10})),  # 5 outputs: rows
          # 0 and 1 come before the 7th token, rows 2 and 3 after it (the drafts count)
          SamplingParams(8, allowed_token_ids=frozenset({1, 3, 8}), frequency_penalty=0.5)]


def test_adjusted_rows_match_the_plain_reference_drafts_included():
    vocab = 12
    gen = torch.Generator().manual_seed(0)
    rows, expected = [], []
    for i, params in enumerate(PARAMS):
        seq = Sequence([1, 3, 3, 11], params, decoder=None)
        seq.output_ids = [4, 4, 2, 7, 4][:i + 1]
        seq.draft = [7, 5, 4]
        for r in range(len(seq.draft) + 1):  # row r: drawn after the first r drafts
            rows.append((seq, r))
    logits = torch.randn(len(rows), vocab, generator=gen) * 3                 # [R, V]
    logits[0, 5] = float("-inf")   # a masked-out token stays so
    for (seq, r), row in zip(rows, logits.tolist()):
        expected.append(reference(row, seq.params, seq.prompt_ids, seq.output_ids + seq.draft[:r]))
    got = penalties.adjusted(logits, rows)
    assert got.tolist() == expected
    assert got.data_ptr() != logits.data_ptr()            # the raw logits (logprobs) untouched
    plain = logits[:4]                                     # rows 0-3: the request without any
    assert penalties.adjusted(plain, rows[:4]) is plain


def test_counts_follow_the_output_as_it_grows():
    seq = Sequence([5], SamplingParams(8, frequency_penalty=1.0), decoder=None)
    logits = torch.zeros(1, 8)
    for step, token in enumerate([3, 3, 6]):
        seq.output_ids.append(token)
        got = penalties.adjusted(logits, [(seq, 0)])[0].tolist()
        assert got == reference([0.0] * 8, seq.params, seq.prompt_ids, seq.output_ids), step


def plain_decode(model, prompt: list[int], max_tokens: int, params: SamplingParams) -> list[int]:
    """Greedy decoding one step at a time, the reference's adjustment before each argmax."""
    cache = model.new_cache(len(prompt) + max_tokens)
    logits = model.forward(torch.tensor(prompt), cache, 0)[-1]
    ids = []
    while True:
        row = reference(logits.tolist(), params, prompt, ids)
        ids.append(int(np.argmax(np.asarray(row, dtype=np.float32))))
        if len(ids) == max_tokens:
            return ids
        logits = model.decode_batch(torch.tensor([ids[-1]]), [cache], [len(prompt) + len(ids) - 1])[0]


CODE = ("def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")


@pytest.mark.parametrize("speculative", [False, True])
def test_greedy_tokens_are_the_plain_loops_with_the_reference_applied(llama, speculative,
                                                                      monkeypatch):
    """A copying prompt under light penalties that change the answer and still let drafts
    stand (step costs fixed at the prior, as in test_speculative.py: which drafts are tried
    then follows the tokens alone)."""
    monkeypatch.setattr(speculate.StepCost, "relative",
                        property(lambda cost: speculate.prior_cost()))
    prompt = llama.tokenizer.encode("Copy this code exactly, then stop.\n\n" + CODE + "\nCopy:\n\n")
    fields = {"frequency_penalty": 0.1, "presence_penalty": 0.05, "repetition_penalty": 1.02,
              "logit_bias": ((llama.tokenizer.encode(" height")[0], -2.0),)}
    with RunningEngine(llama.model, speculative=speculative, prefix_cache_bytes=0) as engine:
        unpenalized = collect(engine.submit(prompt, 24))
        seq = engine.submit(prompt, 24, **fields)
        got = collect(seq)
        drafted = engine.value("kimi_engine_spec_draft_tokens_total")
    want = plain_decode(llama.model, prompt, 24, SamplingParams(24, temperature=0, **fields))
    assert got == want
    assert got != unpenalized                      # the fields change the answer
    if speculative:
        assert seq.spec is not None and seq.spec[1].num_accepted > 0 and drafted > 0


def test_served_requests_apply_them_and_refuse_what_cannot_apply(llama):
    """Over HTTP, chat and completions: a +100 bias makes every token that token (the
    fields were ignored before: the answer did not change); an id outside the vocabulary
    and an out-of-range penalty are 400s naming the field."""
    from tests.support.engine import InProcessEngine, post
    one = llama.tokenizer.encode("1")[0]
    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 6,
            "temperature": 0, "return_token_ids": True}
    text = {"prompt": "Colours: red,", "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=1024) as engine:
        biased = post(engine.sock, "/v1/chat/completions",
                      {**chat, "logit_bias": {str(one): 100}}).json()
        biased_text = post(engine.sock, "/v1/completions",
                           {**text, "logit_bias": {str(one): 100}}).json()
        outside = post(engine.sock, "/v1/chat/completions",
                       {**chat, "logit_bias": {str(llama.tokenizer.vocab_size): 1}})
        too_much = post(engine.sock, "/v1/completions", {**text, "frequency_penalty": 2.5})
    assert biased["choices"][0]["token_ids"] == [one] * 6
    assert biased_text["choices"][0]["token_ids"] == [one] * 6
    assert outside.status == 400 and outside.json()["error"]["param"] == "logit_bias"
    assert str(llama.tokenizer.vocab_size) in outside.json()["error"]["message"]
    assert too_much.status == 400 and too_much.json()["error"]["param"] == "frequency_penalty"


def test_served_min_tokens_stop_token_ids_and_kept_stop_strings(llama):
    """vLLM's min_tokens (no end before that many tokens, no stop string either),
    stop_token_ids (an id of the plain answer ends it there, ignore_eos or not),
    include_stop_str_in_output (the stop string stays in the text) and allowed_token_ids, on
    an answer that ends by itself after 8 tokens. All were ignored before."""
    from tests.support.engine import InProcessEngine, post
    chat = {"messages": [{"role": "user", "content": "What is the capital of France? One word."}],
            "max_tokens": 40, "temperature": 0, "return_token_ids": True}
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=1024) as engine:
        def ask(**fields):
            return post(engine.sock, "/v1/chat/completions", {**chat, **fields}).json()["choices"][0]
        plain = ask()
        ids = plain["token_ids"]
        longer = ask(min_tokens=len(ids) + 4)
        cut = ask(stop_token_ids=[ids[2]])
        word = plain["message"]["content"].split()[3]                     # "France"
        kept, dropped = ask(stop=[word], include_stop_str_in_output=True), ask(stop=[word])
        early = plain["message"]["content"].split()[1]                    # "capital", token 2
        unstopped = ask(stop=[early], min_tokens=4)                       # found before token 4
        without_eos = ask(stop_token_ids=[ids[2]], ignore_eos=True, max_tokens=12)
        only = ask(allowed_token_ids=[ids[0], ids[-1]], max_tokens=6)   # "The", then the end
        stopped_early = ask(stop=[early])
    assert plain["finish_reason"] == "stop" and len(ids) < 20
    assert len(longer["token_ids"]) >= len(ids) + 4 and longer["token_ids"][:len(ids) - 1] == ids[:-1]
    assert cut["token_ids"] == ids[:3] and cut["finish_reason"] == "stop"
    assert kept["message"]["content"].endswith(word) and kept["finish_reason"] == "stop"
    assert kept["message"]["content"] == dropped["message"]["content"] + word
    assert unstopped["message"]["content"] == plain["message"]["content"]
    assert stopped_early["message"]["content"] == "The "
    assert without_eos["token_ids"] == ids[:3]           # stop_token_ids hold with ignore_eos
    assert set(only["token_ids"]) <= {ids[0], ids[-1]} and only["token_ids"] != ids[:6]


def test_min_tokens_beside_tools_the_grammar_decides_once_it_masks(llama):
    """With tools (tool_choice auto) the tool grammar sleeps until a call opens: min_tokens
    holds the end back until then and gives way to the grammar after (both masks could
    leave no token); it was a 400. From the first token (a forced call) it still is one."""
    from tests.support.engine import InProcessEngine, post
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [tool], "max_tokens": 40, "temperature": 0, "min_tokens": 3}
    with InProcessEngine(llama.model, llama.tokenizer, llama.chat, max_context=1024) as engine:
        auto = post(engine.sock, "/v1/chat/completions", body)
        forced = post(engine.sock, "/v1/chat/completions", {**body, "tool_choice": "required"})
    assert auto.status == 200, auto.body
    assert auto.json()["usage"]["completion_tokens"] >= 3
    assert forced.status == 400 and forced.json()["error"]["param"] == "min_tokens"
