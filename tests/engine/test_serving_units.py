"""Request parsing, context fitting, the log sink and sd_notify, without a daemon."""
import os
import socket
import threading

import pytest

from engined.serving import parse as api
from engined.errors import ContextLengthExceeded, InvalidRequest
from engined.serving.logs import LogSink
from kimi_common.notify import sd_notify


def test_parse_chat_fields():
    req = api.parse_chat({"messages": [{"role": "user", "content": "hi"}],
                          "max_completion_tokens": 5, "max_tokens": 9, "temperature": 0,
                          "stop": "x", "logprobs": True, "top_logprobs": 2, "stream": True,
                          "stream_options": {"include_usage": True}, "top_k": -1, "seed": 3})
    assert req.max_tokens == 5 and req.sampling.stop == ("x",) and req.num_top_logprobs == 2
    assert req.stream and req.include_usage and req.sampling.top_k == 0
    assert req.sampling.temperature == 0 and req.sampling.seed == 3


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99},
     "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": []}, "stream_options"),
    ({"messages": {}}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5}, "presence_penalty"),
    ({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": "1"}, "frequency_penalty"),
    ({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"7": 100.5}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"seven": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": [[7, 1]]}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "min_p": 1.5}, "min_p"),
    ({"messages": [{"role": "user", "content": "x"}], "min_tokens": -1}, "min_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "stop_token_ids": ["2"]}, "stop_token_ids"),
    ({"messages": [{"role": "user", "content": "x"}], "best_of": 3}, "best_of"),
    ({"messages": [{"role": "user", "content": "x"}], "use_beam_search": True}, "use_beam_search"),
    ({"messages": [{"role": "user", "content": "x"}], "include_stop_str_in_output": 1},
     "include_stop_str_in_output"),
    ({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {" 7": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1_0": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"7": 10**400}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": float("nan")}, "presence_penalty"),
    ({"messages": [{"role": "user", "content": "x"}], "allowed_token_ids": []}, "allowed_token_ids"),
    ({"messages": [{"role": "user", "content": "x"}], "bad_words": ["no"]}, "bad_words"),
    ({"messages": [{"role": "user", "content": "x"}], "skip_special_tokens": False}, "skip_special_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1}, "prompt_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "truncate_prompt_tokens": 8},
     "truncate_prompt_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "best_of": True}, "best_of"),
    ({"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}, "functions"),
    ({"messages": [{"role": "user", "content": "x"}], "function_call": {"name": "f"}}, "function_call"),
    ({"messages": [{"role": "user", "content": "x"}], "modalities": ["text", "audio"]}, "modalities"),
    ({"messages": [{"role": "user", "content": "x"}], "audio": {"voice": "alloy"}}, "audio"),
    ({"messages": [{"role": "user", "content": "x"}], "web_search_options": {}}, "web_search_options"),
])
def test_parse_chat_rejects(body, param):
    with pytest.raises(InvalidRequest) as info:
        api.parse_chat(body)
    assert info.value.param == param and info.value.status == 400


def test_parse_sampling_penalties_logit_bias_and_vllms_fields():
    """Once silently ignored (unknown fields are): now parsed (engine/penalties.py, sampler)."""
    sampling = api.parse_completion({"prompt": "x", "presence_penalty": -2, "frequency_penalty": 0.5,
                                     "repetition_penalty": 1.2,
                                     "logit_bias": {"7": -100, "12": 2.5}}).sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (-2.0, 0.5)
    assert sampling.repetition_penalty == 1.2 and sampling.logit_bias == ((7, -100.0), (12, 2.5))
    plain = api.parse_sampling({})
    assert (plain.presence_penalty, plain.frequency_penalty, plain.repetition_penalty,
            plain.logit_bias) == (0.0, 0.0, 1.0, ())
    assert (plain.min_p, plain.min_tokens, plain.stop_token_ids, plain.include_stop) == (0, 0, (), False)
    vllm = api.parse_sampling({"min_p": 0.05, "min_tokens": 4, "stop_token_ids": [2, 9],
                               "include_stop_str_in_output": True, "best_of": 1})
    assert (vllm.min_p, vllm.min_tokens, vllm.stop_token_ids, vllm.include_stop) == (0.05, 4, (2, 9), True)
    # the values of vLLM's unoffered fields that ask nothing pass (clients send defaults)
    api.parse_sampling({"best_of": 1, "use_beam_search": False, "bad_words": [],
                        "skip_special_tokens": True, "prompt_logprobs": None})
    # two keys of one id: the last wins (vLLM's dict), so no token gets past +-100
    assert api.parse_sampling({"logit_bias": {"7": 60, "07": 70}}).logit_bias == ((7, 70.0),)
    # a temperature too small to divide by is greedy (vLLM's epsilon): logits / 1e-300 are inf
    assert api.parse_sampling({"temperature": 1e-300}).temperature == 0.0


def test_what_asks_nothing_passes_and_a_suffix_is_refused():
    """Clients send defaults of fields the engine does not offer: those pass. A completion
    with a suffix (insertion) was answered as if it had none."""
    api.parse_chat({"messages": [{"role": "user", "content": "x"}], "functions": [],
                    "modalities": ["text"], "audio": None, "function_call": "none", "best_of": 1.0})
    assert api.parse_completion({"prompt": "x", "suffix": ""}).prompt_text == "x"
    with pytest.raises(InvalidRequest) as info:
        api.parse_completion({"prompt": "def f(", "suffix": "return x"})
    assert info.value.param == "suffix" and info.value.status == 400


def test_parse_completion_prompts():
    assert api.parse_completion({"prompt": [1, 2, 3]}).prompt_ids == [1, 2, 3]
    assert api.parse_completion({"prompt": ["text"]}).prompt_text == "text"
    assert api.parse_completion({"prompt": "x"}).max_tokens == 16
    for bad in ([], [1, "a"], 5, ["a", "b"]):
        with pytest.raises(InvalidRequest):
            api.parse_completion({"prompt": bad})
    with pytest.raises(InvalidRequest, match="0 only with echo"):
        api.parse_completion({"prompt": "x", "max_tokens": 0})


def test_fit_context():
    assert api.fit_context(10, None, 100) == 90
    assert api.fit_context(10, 90, 100) == 90
    with pytest.raises(ContextLengthExceeded) as info:
        api.fit_context(10, 91, 100)
    assert info.value.body()["error"]["code"] == "context_length_exceeded"
    assert info.value.body()["error"]["type"] == "invalid_request_error"
    with pytest.raises(ContextLengthExceeded):
        api.fit_context(100, None, 100)


def test_log_reopen_loses_no_lines(tmp_path):
    path = tmp_path / "engine.log"
    sink = LogSink(path)
    count = 2000

    def writer():
        for i in range(count):
            sink.write(f"line {i}")

    thread = threading.Thread(target=writer)
    thread.start()
    for n in range(5):
        os.rename(path, tmp_path / f"engine.log.{n}")
        sink.reopen()
    thread.join()
    sink.close()
    lines = [line for f in tmp_path.iterdir() for line in f.read_text().splitlines()]
    assert sorted(int(line.rsplit(" ", 1)[1]) for line in lines) == list(range(count))


def test_sd_notify_sends_ready(tmp_path):
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        listener.settimeout(5)
        assert sd_notify("READY=1", {"NOTIFY_SOCKET": address})
        assert listener.recv(64) == b"READY=1"
    assert not sd_notify("READY=1", {})


def test_a_request_that_leaves_no_token_to_draw_is_refused():
    """allowed_token_ids of stop tokens only, under min_tokens: every logit would be -inf
    (the draw then took token 0, outside the set). Vocabulary 100, chat stop id 2."""
    def check(**fields):
        api.check_for_model(api.parse_sampling(fields), 100, frozenset({2}), 16, None)
    with pytest.raises(InvalidRequest) as info:
        check(allowed_token_ids=[2], min_tokens=2)
    assert info.value.param == "allowed_token_ids"
    with pytest.raises(InvalidRequest):
        check(allowed_token_ids=[7], stop_token_ids=[7], min_tokens=1)
    check(allowed_token_ids=[2, 5], min_tokens=2)          # 5 can be drawn: fine
    check(allowed_token_ids=[2], ignore_eos=True, min_tokens=2)   # 2 no longer stops
    with pytest.raises(InvalidRequest) as info:
        check(stop_token_ids=[100])
    assert info.value.param == "stop_token_ids"

