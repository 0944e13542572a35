"""Our Llama forward against HF transformers loading the SAME GGUF in fp32 (test-only dep).

Prompts are fixed token-id lists (made once with HF's tokenizer for the GGUF), so this test
does not depend on our tokenizer."""
import os

import pytest
import torch

from engined.weights import loader
from tests.support import default_artifact

PROMPTS = {
    # "The capital of France is"
    "completion": [504, 3575, 282, 4649, 314],
    # SmolLM2 chat template, system prompt + "What is 12 times 7?", generation prompt
    "chat": [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
             411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 216, 33, 34, 1711, 216, 39,
             47, 2, 198, 1, 520, 9531, 198],
    # "def fibonacci(n):\n    "
    "code": [1604, 3987, 46477, 24, 94, 727, 2367],
}
NEW_TOKENS = 16
# Exact configuration (fp32 embedding/LM head and KV): the weights are bit-identical to HF's
# after the lossless repack, so only fp32 summation order differs (matmul blocking, SDPA).
# Observed max |diff| is ~6e-5 on logits up to ~35; 1e-3 leaves a 15x margin, while any real
# mistake (RoPE layout, q/k permute, norm eps, GQA grouping) moves logits by >= 0.1.
EXACT_ATOL = 1e-3
# Shipped configuration (fp16 embedding/LM head and fp16 KV, chosen for memory and speed):
# the fp16 head weights round the Q8_0 values (d*q needs up to 18 bits) at 2^-11 relative and
# the KV cache adds 2^-11 per entry. On the CPU the head is the C gemv_f16 kernel, which
# accumulates and returns fp32, so no logit is rounded to fp16 (on other devices a fp16 matmul
# rounds them, |logit| <= ~35: half an ulp is 2^-6 = 0.016; the top TiedEmbedding.REFINE are
# then recomputed in fp32). 0.08 bounds the unrefined case at ~3x its observed 0.02-0.03.
SHIPPED_ATOL = 0.08
# The top logits carry no output rounding on any device: only the fp16 weights and KV remain,
# observed <= ~0.005; 0.015 bounds it. Greedy needs this: the chat prompt has a step where HF's
# top two logits are 0.007 apart.
REFINED_ATOL = 0.015


@pytest.fixture(scope="module")
def hf_model(default_gguf):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(str(default_gguf.parent), gguf_file=default_gguf.name,
                                                     dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(default_artifact.seed(tmp_path_factory.mktemp("cache"),
                                                              tmp_path_factory)))
        mp.delenv("CACHE_DIRECTORY", raising=False)
        yield


@pytest.fixture(scope="module")
def shipped(private_cache):
    """The shipped model on the W4A16 path with the fp16 head: this file tests the model's
    wiring (the W4A8 decode path that AVX2-only CPUs default to, and the Q8_0 head every CPU
    with the helper defaults to, have their own gate: bench/quality.py)."""
    loaded = loader.load_model("default", threads=min(2, os.cpu_count() or 1), progress=False,
                               embed_dtype=loader.EMBED_DTYPE)
    loaded.model.select_decode_gemv("w4a16_gemv")
    return loaded


@pytest.fixture(scope="module")
def exact(private_cache, shipped):
    loaded = loader.load_model("default", progress=False, embed_dtype=torch.float32,
                               kv_dtype=torch.float32)
    loaded.model.select_decode_gemv("w4a16_gemv")
    return loaded


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    """[T, V] fp32 logits for every position."""
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    cache = model.new_cache(len(prompt) + new_tokens)
    logits = model.forward(torch.tensor(prompt), cache, 0)
    out = []
    for step in range(new_tokens):
        out.append(int(logits[0].argmax()))
        logits = model.forward(torch.tensor(out[-1:]), cache, len(prompt) + step)
    return out


def test_default_model_identity(shipped):
    c = shipped.model.config
    assert shipped.model_id == "SmolLM2-135M-Instruct"
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta, c.tie_embeddings) == (1536, 49152, 100000.0, True)
    assert shipped.context_length == c.context_length == 8192


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_first_step_logits_match_hf(hf_model, exact, shipped, name):
    prompt = PROMPTS[name]
    ref = hf_logits(hf_model, prompt)[-1]
    for loaded, atol in ((exact, EXACT_ATOL), (shipped, SHIPPED_ATOL)):
        ours = loaded.model.forward(torch.tensor(prompt), loaded.model.new_cache(len(prompt)), 0)[0]
        assert float((ours - ref).abs().max()) <= atol
        assert int(ours.argmax()) == int(ref.argmax())
    top = ours.topk(shipped.model.embedding.REFINE).indices
    assert float((ours[top] - ref[top]).abs().max()) <= REFINED_ATOL


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_tokens_match_hf(hf_model, shipped, name):
    # One HF forward over prompt + our tokens checks HF's greedy choice at every step: if HF's
    # argmax after each prefix equals our next token, HF's own greedy run yields the same 16.
    prompt = PROMPTS[name]
    ours = greedy(shipped.model, prompt, NEW_TOKENS)
    ref = hf_logits(hf_model, prompt + ours[:-1])[len(prompt) - 1:]  # [16, V]
    assert ref.argmax(-1).tolist() == ours


def test_prefill_decode_and_chunked_prefill_agree(exact):
    # Prefill (dequantize + matmul, masked attention) against token-by-token decode (the
    # w4a16_gemv kernel, no mask) and a two-chunk prefill (start > 0 with a mask): same
    # weights, fp32 throughout, so they differ only in summation order.
    model, prompt = exact.model, torch.tensor(PROMPTS["chat"])
    full = model.forward(prompt, model.new_cache(len(prompt)), 0, last_only=False)  # [T, V]
    cache = model.new_cache(len(prompt))
    stepwise = torch.cat([model.forward(prompt[i:i + 1], cache, i) for i in range(len(prompt))])
    cache = model.new_cache(len(prompt))
    first = model.forward(prompt[:20], cache, 0, last_only=False)
    second = model.forward(prompt[20:], cache, 20, last_only=False)
    torch.testing.assert_close(stepwise, full, atol=EXACT_ATOL, rtol=0)
    torch.testing.assert_close(torch.cat([first, second]), full, atol=EXACT_ATOL, rtol=0)


def test_cache_bounds_are_checked(shipped):
    model = shipped.model
    cache = model.new_cache(4)
    with pytest.raises(ValueError, match="do not fit a cache of 4 tokens"):
        model.forward(torch.tensor([1, 2, 3]), cache, 2)
    with pytest.raises(ValueError, match="must be 1..8192"):
        model.new_cache(8193)


def test_plan_matches_loaded_model(shipped):
    plan = loader.plan_model("default")
    default = loader.load_model("default", progress=False).model    # the head as served
    assert plan.weight_bytes == default.weight_bytes
    head = 49152 * 576
    q8 = loader.default_embed_dtype("cpu") == loader.EMBED_Q8
    assert shipped.model.weight_bytes - default.weight_bytes == (head * 2 - head - head // 16 if q8 else 0)
    assert plan.kv_bytes_per_token == shipped.model.kv_bytes_per_token == 30 * 2 * 3 * 64 * 2
    assert plan.total_bytes(8192) == plan.weight_bytes + 8192 * plan.kv_bytes_per_token
    assert shipped.model.new_cache(16).data.nbytes == 16 * plan.kv_bytes_per_token


def test_the_decode_gemv_follows_the_widest_kernel(monkeypatch):
    """W4A8 (in tiles) decodes where its integer dots are as wide as W4A16's fp32 FMAs: VNNI
    (AVX-512 or AVX-VNNI), or AVX2 without AVX-512; W4A16 on AVX-512 without VNNI."""
    from engined import helper
    from engined.models import llama
    for w4a8, w4a16, want in ((1, 1, "w4a8_tiles"), (1, 2, "w4a16_gemv"), (0, 0, "w4a8_tiles"),
                              (3, 2, "w4a8_tiles"), (2, 2, "w4a8_tiles"), (2, 1, "w4a8_tiles")):
        monkeypatch.setattr(helper, "w4a8_simd", lambda level=None, w=w4a8: w)
        monkeypatch.setattr(helper, "gemv_simd", lambda level=None, v=w4a16: v)
        assert llama.decode_gemv_op("cpu") == want
        assert llama.decode_gemv_op("cuda") == "w4a16_gemv"
    monkeypatch.setattr(helper, "available", lambda: False)
    assert llama.decode_gemv_op("cpu") == "w4a16_gemv"


def test_the_shipped_model_decodes_through_the_chosen_gemv(private_cache):
    from engined.models import llama
    model = loader.load_model("default", progress=False).model
    assert model.decode_gemv == llama.decode_gemv_op("cpu")
    print(f"default model decodes through {model.decode_gemv}")
