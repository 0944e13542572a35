"""An independent anchor for what the CPU serves: the default model exactly as `serve` loads it
(the decode GEMV this machine's SIMD picks, W4A8 where its integer dots are widest; the Q8_0
head; one native call per layer) runs teacher-forced over ~2k tokens of the frozen text of
bench/quality.py, against HF transformers in fp32 on the same GGUF.

The first half goes through the served prefill (chunks of the engine's PREFILL_CHUNK), the
second through the served decode (one decode_batch step per token). Both must keep
perplexity within bench/quality.py's gate of HF's and agree with HF's top-1 at least as often
as the gate asks; every recorded quality run holds the gate with room (+0.13..+0.49%,
96.2..97.0%), so these are the gate's own bounds, not loosened ones."""
import hashlib
import math

import pytest
import torch

from engined.engine.loop import PREFILL_CHUNK
from tests.support import bench
from tests.support.engine import load_default_model

PREFILL_TOKENS, DECODE_TOKENS = 1024, 1024


def quality_gate():
    return bench.load("quality")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return load_default_model(tmp_path_factory)


@pytest.fixture(scope="module")
def text_ids(served) -> list[int]:
    gate = quality_gate()
    data = gate.TEXT.read_bytes()
    assert hashlib.sha256(data).hexdigest() == gate.TEXT_SHA256, "the frozen text changed"
    ids = served.tokenizer.encode(data.decode(), add_bos=True)[:PREFILL_TOKENS + DECODE_TOKENS]
    assert len(ids) == PREFILL_TOKENS + DECODE_TOKENS
    return ids


def served_logits(model, ids: list[int]) -> torch.Tensor:
    """[T, V] fp32: the prompt half as the engine prefills it, the rest as it decodes."""
    tokens = torch.tensor(ids)
    cache = model.new_cache(len(ids))
    with torch.inference_mode():
        rows = [model.forward(tokens[i:min(i + PREFILL_CHUNK, PREFILL_TOKENS)], cache, i,
                              last_only=False).float()
                for i in range(0, PREFILL_TOKENS, PREFILL_CHUNK)]
        rows += [model.decode_batch(tokens[i:i + 1], [cache], [i]).float()
                 for i in range(PREFILL_TOKENS, len(ids))]
    return torch.cat(rows)


def hf_logits(default_gguf, ids: list[int]) -> torch.Tensor:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(str(default_gguf.parent),
                                                  gguf_file=default_gguf.name,
                                                  dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def perplexity(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return math.exp(float(torch.nn.functional.cross_entropy(logits[:-1].double(), ids[1:])))


def test_the_served_cpu_path_stays_within_the_quality_gate_of_hf_fp32(served, text_ids,
                                                                       default_gguf):
    gate = quality_gate()
    ours, ref = served_logits(served.model, text_ids), hf_logits(default_gguf, text_ids)
    ids = torch.tensor(text_ids)
    print(f"served decode GEMV {served.model.decode_gemv}, head "
          f"{type(served.model.embedding).__name__}")
    for name, rows in (("prefill", slice(0, PREFILL_TOKENS)),
                       ("decode", slice(PREFILL_TOKENS, len(text_ids)))):
        ppl, ppl_hf = perplexity(ours[rows], ids[rows]), perplexity(ref[rows], ids[rows])
        agree = float((ours[rows].argmax(-1) == ref[rows].argmax(-1)).double().mean())
        print(f"{name}: perplexity {ppl:.4f} vs HF fp32 {ppl_hf:.4f} ({100 * (ppl / ppl_hf - 1):+.2f}%), "
              f"top-1 agreement {100 * agree:.2f}%")
        assert abs(ppl / ppl_hf - 1) <= gate.PERPLEXITY_CHANGE, name
        assert agree >= gate.TOP1_AGREEMENT, name
