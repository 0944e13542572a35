"""A warm prefix cache never changes an answer: a greedy request gives the same tokens and the
same logprobs, bit for bit, cold and warm, on the default model and on the tiny Kimi-Linear
checkpoint, whatever earlier requests left in the cache (any split of the prompt between
restored rows and prefill). The prompts are long, repetitive agent-style system prompts, where
near-ties between the top tokens are common (issue 25, item 10)."""
import pytest

from tests.engine.batching_helpers import RunningEngine, collect

NEW = 12
CHUNK = 256  # the engine's default prefill chunk


def agent_prompt(tokenizer, rules: int) -> list[int]:
    text = "system: You are a coding agent working in the user's repository.\n"
    text += "".join(f"Rule {i}: read a file before you edit it; never run a command that "
                    "deletes data without asking the user first.\n" for i in range(rules))
    return tokenizer.encode(text + "user: which rule covers deleting data, and what does it "
                            "say?\nassistant:")


def greedy_with_logprobs(engine: RunningEngine, prompt: list[int], max_tokens: int):
    return collect(engine.submit(prompt, max_tokens, num_top_logprobs=0), logprobs=True)


def earlier_requests(prompt: list[int]) -> dict[str, list[list[int]]]:
    """What may sit in the cache before `prompt` arrives: its prefixes cut anywhere (inside a
    64-token block, on one, on a prefill chunk), the prompt itself, another continuation."""
    n = len(prompt)
    other = prompt[:n // 2] + prompt[n // 2:][::-1]
    return {"none": [], "a third": [prompt[:n // 3]], "64-aligned": [prompt[:(n // 2) // 64 * 64]],
            "one chunk": [prompt[:CHUNK]], "all but 5": [prompt[:n - 5]], "itself": [prompt],
            "growing turns": [prompt[:n // 4], prompt[:n // 2], prompt[:3 * n // 4]],
            "another continuation": [other]}


def check_cold_equals_warm(model, prompt, **engine_options):
    with RunningEngine(model, prefix_cache_bytes=0, **engine_options) as cold:
        want = greedy_with_logprobs(cold, prompt, NEW)
    differing = {}
    for name, before in earlier_requests(prompt).items():
        with RunningEngine(model, **engine_options) as warm:
            for earlier in before:
                greedy_with_logprobs(warm, earlier, 1)
            hit_before = warm.value("kimi_engine_prefix_cache_hit_tokens_total")
            got = greedy_with_logprobs(warm, prompt, NEW)
            hit = warm.value("kimi_engine_prefix_cache_hit_tokens_total") - hit_before
        if got != want:
            differing[name] = (hit, max(abs(a[1] - b[1]) for a, b in zip(got, want)))
        if name in ("itself", "growing turns"):
            assert hit > 0, f"{name}: the cache was never used"
    assert not differing, f"warm != cold (restored tokens, max logprob diff): {differing}"


def test_default_model_warm_cache_gives_the_cold_answer(llama):
    prompt = agent_prompt(llama.tokenizer, 60)
    assert len(prompt) > 4 * CHUNK
    check_cold_equals_warm(llama.model, prompt)


def test_kimi_linear_warm_cache_gives_the_cold_answer(kimi):
    prompt = agent_prompt(kimi.tokenizer, 12)[-480:]  # the tiny checkpoint's context is 512
    check_cold_equals_warm(kimi.model, prompt, max_context=512, prefill_chunk=64)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    from engined.weights.kimi_checkpoint import load_kimi_linear
    from tests.support import kimi_tiny
    path = kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "tiny")
    return load_kimi_linear(path, progress=False)
