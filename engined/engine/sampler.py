"""Next-token choice: greedy at temperature 0, else temperature -> top-k -> top-p -> draw
with the request's own torch.Generator (seeded from `seed`, so runs repeat exactly).
Logprobs always come from the model's raw distribution (log_softmax of the logits).
"""
import torch

from engined.engine.sequence import SamplingParams, TokenLogprob


def new_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return generator


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """logits: [V] fp32 -> the chosen token id."""
    if params.is_greedy:
        return int(torch.argmax(logits))
    scaled = logits.float() / params.temperature  # [V]
    if 0 < params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        scaled = _mask_top_p(scaled, params.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _mask_top_p(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches top_p (at least one)."""
    sorted_logits, order = torch.sort(scaled, descending=True)  # [V], [V]
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)  # [V]
    is_outside = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before >= p
    sorted_logits = sorted_logits.masked_fill(is_outside, float("-inf"))
    return torch.empty_like(scaled).scatter_(0, order, sorted_logits)


def token_logprob(logits: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """logits: [V] -> the chosen token's logprob plus the num_top best alternatives."""
    return _entry(torch.log_softmax(logits.float(), dim=-1), token_id, num_top)


def _entry(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """logprobs: [V] (already normalized)."""
    top = ()
    if num_top > 0:
        values, ids = torch.topk(logprobs, num_top)
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token_id, float(logprobs[token_id]), top)


def prompt_logprobs(logits: torch.Tensor, prompt_ids: list[int], start: int, num_top: int
                    ) -> tuple[TokenLogprob, ...]:
    """logits: [T, V] for prompt positions start..start+T-1; row r predicts the token at
    start+r+1. -> entries for the prompt tokens it scores (the first token has no context)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [T, V]
    entries = [TokenLogprob(prompt_ids[0], None)] if start == 0 else []
    for row in range(logits.shape[0]):
        position = start + row + 1
        if position >= len(prompt_ids):
            break
        entries.append(_entry(logprobs[row], prompt_ids[position], num_top))
    return tuple(entries)
