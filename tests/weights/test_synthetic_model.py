"""`--model synthetic:NAME`: random Kimi-Linear weights served through the same loader and
serving path, so the served decode can be measured with no checkpoint file."""
import shutil

import pytest
import torch

from engined.config import EngineConfig
from engined.commands import doctor
from engined.weights import loader, synthetic
from tests.support.engine import Daemon, post, stream


def test_plan_matches_the_loaded_model():
    plan = loader.plan_model("synthetic:tiny")
    loaded = loader.load_model("synthetic:tiny")
    model = loaded.model
    assert plan.weight_bytes == model.weight_bytes + model.state_bytes
    assert plan.kv_bytes_per_token == model.kv_bytes_per_token
    assert plan.context_length == loaded.context_length == 1024
    assert loaded.tokenizer.vocab_size == model.config.vocab_size == 512
    assert any(lin.is_int4 for lin in (model.layers[1].ffn.shared_experts.down_proj,))


def test_every_id_decodes_and_text_round_trips():
    tok = synthetic.byte_tokenizer(4096)
    assert tok.vocab_size == 4096
    assert all(tok.token_bytes(i) for i in range(tok.vocab_size))
    assert tok.decode(tok.encode("héllo, wörld")) == "héllo, wörld"
    assert tok.token_to_id("<|im_end|>") is not None and tok.eos_id is not None


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(loader.ModelLoadError, match="synthetic:small"):
        loader.plan_model("synthetic:huge")
    bad = doctor.check_model(EngineConfig(model="synthetic:huge"))
    assert not bad.is_ok and "synthetic:tiny" in bad.fix
    assert doctor.check_model(EngineConfig(model="synthetic:tiny")).is_ok


def test_greedy_decode_is_deterministic():
    a, b = loader.load_model("synthetic:tiny"), loader.load_model("synthetic:tiny")
    prompt = torch.tensor(a.tokenizer.encode("same seed, same weights"))
    assert torch.equal(a.model.forward(prompt, a.model.new_cache(64), 0),
                       b.model.forward(prompt, b.model.new_cache(64), 0))


def test_the_daemon_serves_a_synthetic_model(tmp_path):
    daemon = Daemon(tmp_path / "cache", "--model", "synthetic:tiny", "--max-context", "512").start()
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        reply = post(daemon.sock, "/v1/chat/completions", body)
        assert reply.status == 200, reply.body
        assert len(reply.json()["choices"][0]["token_ids"]) == 8
        events = stream(daemon.sock, "/v1/chat/completions", {**body, "stream": True})
        streamed = [i for e in events[1:] if e != "[DONE]" for i in e["choices"][0]["token_ids"]]
        assert streamed == reply.json()["choices"][0]["token_ids"]
    finally:
        daemon.stop()
        shutil.rmtree(daemon.dir, ignore_errors=True)
