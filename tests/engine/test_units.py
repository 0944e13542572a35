"""Unit tests of the engine's pieces that need no model: config, stop strings, sampler,
scheduler, request validation, log reopening and sd_notify."""
import os
import socket
import stat
import threading

import pytest
import torch

from engined.serving import parse as api
from engined.engine import sampler
from engined.config import (ConfigError, EngineConfig, default_socket_path, ensure_socket_dir,
                            parse_size)
from engined.errors import ContextLengthExceeded, InvalidRequest
from engined.serving.logs import LogSink
from engined.serving.notify import sd_notify
from engined.engine.scheduler import Scheduler
from engined.engine.sequence import SamplingParams, Sequence, StopMatcher


# -- config --------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("600MB", 600_000_000), ("2GiB", 2 * 1024**3), ("2G", 2 * 1024**3), ("1234", 1234),
    (4096, 4096), ("1.5KiB", 1536), (" 10 kb ", 10_000), ("0", 0)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "12XB", "-5MB", "", True, "1e9"])
def test_parse_size_rejects(bad):
    with pytest.raises(ConfigError, match="expected a size"):
        parse_size(bad)


def test_socket_path_rule():
    assert str(default_socket_path({"RUNTIME_DIRECTORY": "/run/kimi", "XDG_RUNTIME_DIR": "/x"})
               ) == "/run/kimi/engine.sock"
    assert str(default_socket_path({"XDG_RUNTIME_DIR": "/run/user/7"})
               ) == "/run/user/7/kimi/engine.sock"
    assert str(default_socket_path({})) == f"/tmp/kimi-{os.getuid()}/engine.sock"


def test_socket_dirs_are_created_private(tmp_path):
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "a" / "b" / "engine.sock"
    ensure_socket_dir(path)
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755  # existing parents are left alone


def test_layering_precedence(tmp_path):
    config_file = tmp_path / "engine.toml"
    config_file.write_text('max-context = 100\nthreads = 3\ndevice = "cpu"\n')
    env = {"KIMI_ENGINE_MAX_CONTEXT": "200", "KIMI_ENGINE_THREADS": "4"}
    flags = {"max_context": 300, "threads": None, "device": None}
    config = EngineConfig.layered(flags, env, config_file)
    assert (config.max_context, config.threads, config.device) == (300, 4, "cpu")
    assert EngineConfig.layered({}, {}, None) == EngineConfig()


def test_config_validation_messages():
    with pytest.raises(ConfigError, match="device: expected one of auto, cpu, cuda"):
        EngineConfig(device="tpu")
    with pytest.raises(ConfigError, match="threads: expected a whole number"):
        EngineConfig(threads="many")
    assert EngineConfig(memory_cap="1KiB").memory_cap == 1024


# -- stop strings ---------------------------------------------------------------------------
def test_stop_string_split_across_tokens_is_trimmed():
    matcher = StopMatcher(("STOP",))
    released = [matcher.push(piece) for piece in ("Hello S", "T", "OP and more")]
    assert released == [("Hello ", False), ("", False), ("", True)]


def test_held_back_text_is_released_when_it_is_not_a_stop():
    matcher = StopMatcher(("</end>",))
    assert matcher.push("a <") == ("a ", False)
    assert matcher.push("b>") == ("<b>", False)
    assert matcher.push("x</en") == ("x", False)
    assert matcher.flush() == "</en"


# -- sampler ---------------------------------------------------------------------------------
def _logits(seed=0, vocab=50):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_argmax_and_ignores_the_generator():
    logits = _logits()
    params = SamplingParams(max_tokens=1, temperature=0)
    assert sampler.sample(logits, params, sampler.new_generator(1)) == int(logits.argmax())
    assert sampler.sample(logits, SamplingParams(1, temperature=1.0, top_k=1),
                          sampler.new_generator(2)) == int(logits.argmax())


def test_seeded_sampling_repeats():
    logits, params = _logits(), SamplingParams(max_tokens=1, temperature=1.0)
    draws = [[sampler.sample(logits, params, g) for _ in range(20)]
             for g in (sampler.new_generator(42), sampler.new_generator(42))]
    assert draws[0] == draws[1]
    assert len(set(draws[0])) > 1


def test_top_k_and_top_p_only_draw_allowed_tokens():
    logits = _logits(3)
    top5 = set(torch.topk(logits, 5).indices.tolist())
    generator = sampler.new_generator(0)
    drawn = {sampler.sample(logits, SamplingParams(1, top_k=5), generator) for _ in range(300)}
    assert drawn <= top5 and len(drawn) > 1
    # reference nucleus: sort, keep tokens while the mass before them is < p
    probs = torch.softmax(logits, -1)
    order = torch.argsort(probs, descending=True).tolist()
    nucleus, mass = set(), 0.0
    for token in order:
        if mass >= 0.6:
            break
        nucleus.add(token)
        mass += float(probs[token])
    drawn = {sampler.sample(logits, SamplingParams(1, top_p=0.6), generator) for _ in range(300)}
    assert drawn <= nucleus and len(drawn) > 1


def test_logprobs_match_log_softmax():
    logits = _logits(5)
    entry = sampler.token_logprob(logits, 7, num_top=3)
    reference = torch.log_softmax(logits.double(), -1)
    assert entry.logprob == pytest.approx(float(reference[7]), abs=1e-5)
    assert [i for i, _ in entry.top] == torch.topk(reference, 3).indices.tolist()


# -- scheduler -------------------------------------------------------------------------------
class _Decoder:
    def push(self, token_id):
        return ""

    def flush(self):
        return ""


def _seq(num_prompt, max_tokens):
    return Sequence(list(range(num_prompt)), SamplingParams(max_tokens), _Decoder())


def test_scheduler_admits_within_budget_and_takes_turns():
    scheduler = Scheduler(token_budget=100)
    a, b, c = _seq(30, 20), _seq(20, 20), _seq(40, 20)  # 50 + 40 + 60 slots
    for seq in (a, b, c):
        scheduler.add(seq)
    assert scheduler.admit() == [a, b]  # c waits: 90 + 60 > 100
    assert [scheduler.next() for _ in range(3)] == [a, b, a]
    scheduler.finish(a)
    assert scheduler.admit() == [c]
    b.cancel()
    assert scheduler.take_cancelled() == [b]
    assert list(scheduler.running) == [c] and scheduler.num_reserved_tokens == 60


def test_an_oversized_request_still_runs_alone():
    scheduler = Scheduler(token_budget=10)
    big = _seq(8, 8)
    scheduler.add(big)
    assert scheduler.admit() == [big]


# -- request validation ----------------------------------------------------------------------
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
])
def test_parse_chat_rejects(body, param):
    with pytest.raises(InvalidRequest) as info:
        api.parse_chat(body)
    assert info.value.param == param and info.value.status == 400


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


# -- logs and notify -------------------------------------------------------------------------
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


def test_a_prompt_that_opens_think_starts_the_output_as_reasoning():
    from engined.chat.output import ContentDelta, ReasoningDelta
    from engined.serving.generate import new_output_parser

    class PlainChat:  # a chat format without its own parser: the hermes one is used
        pass

    def split(prompt):
        parser = new_output_parser(PlainChat(), False, prompt)
        deltas = parser.feed("Let me see.</think>Paris.") + parser.finish()
        return ("".join(d.text for d in deltas if isinstance(d, ReasoningDelta)),
                "".join(d.text for d in deltas if isinstance(d, ContentDelta)))

    assert split("<|im_start|>assistant\n<think>\n") == ("Let me see.", "Paris.")
    assert split("<|im_start|>assistant\n") == ("", "Let me see.</think>Paris.")
