"""Next-token choice for the B rows of a step, on the logits' own device: greedy at temperature
0, else temperature -> top-k -> top-p -> one draw by inverse CDF. Only the chosen ids (and
any requested logprobs) come back to the host.

The draw of row b is a pure function of (seed_b, counter_b): a uniform u from a counter-based
hash (splitmix64 in int64 tensor ops, the same bits on every device) meets the row's own
cumulative distribution. So a seeded request draws the same tokens whatever else is in the
batch, however the batch is padded, and on the CPU or a GPU alike; there is no generator
state to carry. Logprobs always come from the model's raw distribution (log_softmax).
"""
import secrets

import torch

from engined.engine.sequence import SamplingParams, TokenLogprob
from engined.grammar import matcher as grammar_matcher

_M1, _M2 = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64)  # as int64
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)


def new_seed(seed: int | None) -> int:
    """A request's seed as int64: its own, or a fresh random one."""
    value = secrets.randbits(64) if seed is None else seed & 0xFFFF_FFFF_FFFF_FFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """seeds, counters: [B] int64 -> [B] float64 in [0, 1), splitmix64 of seed + counter."""
    z = seeds + (counters + 1) * _GOLDEN              # int64 arithmetic wraps like uint64
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    z = z ^ _shr(z, 31)
    return _shr(z, 11).double() * 2.0 ** -53


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                counters: list[int], grammars: list | None = None,
                observe_mask=lambda ms, is_ready: None) -> list[int]:
    """logits: [B, V] (any device) -> the chosen id of each row, row b drawn with params[b]
    from uniforms(seeds[b], counters[b]), among the tokens grammars[b] allows (None: all)."""
    device = logits.device
    if grammars is not None and any(g is not None for g in grammars):
        logits = grammar_matcher.masked(logits, grammars, observe_mask,
                                        [p.is_greedy for p in params])
    drawn = [b for b, p in enumerate(params) if not p.is_greedy]
    if not drawn:  # all greedy: the ids as a list without a torch op (each runs cold, ~5 us)
        return argmax_list(logits)
    chosen = argmax_rows(logits)                                        # [B] greedy
    # the drawn rows' settings in two host-to-device copies (one a setting cost ~10-20 us on
    # a GPU, every sampled step): ints [4, R], floats fp32 [3, R] (each as torch.tensor of
    # the one list would make it, so the same bits)
    rows, top_k, seed, counter = torch.tensor(
        [drawn, [params[b].top_k for b in drawn], [seeds[b] for b in drawn],
         [counters[b] for b in drawn]], dtype=torch.int64, device=device)
    temperature, top_p, min_p = torch.tensor(
        [[params[b].temperature for b in drawn], [params[b].top_p for b in drawn],
         [params[b].min_p for b in drawn]], dtype=torch.float32, device=device)
    if not any(params[b].min_p > 0 for b in drawn):
        min_p = None                                                    # no row's: no mask
    u = uniforms(seed, counter)
    chosen[rows] = _draw(logits[rows].float() / temperature[:, None], top_k, top_p, u, min_p)
    return chosen.tolist()


_numpy = None  # the numpy module once looked for; False where it is not installed


def argmax_list(logits: torch.Tensor) -> list[int]:
    """argmax_rows(logits).tolist(), with no torch op where numpy's argmax runs."""
    found = _numpy_argmax(logits)
    return found.tolist() if found is not None else logits.argmax(-1).tolist()


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B] int64, each row's first maximum. On the CPU numpy's: 2.6 us for 49,152
    fp32 logits where torch's takes 26 (one thread, the 2-core EPYC), every decode step.
    The GPU image has no numpy: there (and on any device but the CPU) torch's."""
    found = _numpy_argmax(logits)
    return torch.from_numpy(found) if found is not None else logits.argmax(-1)


def _numpy_argmax(logits: torch.Tensor):
    """numpy's row argmax of CPU fp32 logits where numpy is installed, else None."""
    global _numpy
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return None
    if _numpy is None:
        try:
            import numpy as _numpy
        except ImportError:
            _numpy = False
    return logits.numpy().argmax(-1) if _numpy else None


def _draw(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
          u: torch.Tensor, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """scaled: [R, V] logits / temperature; top_k [R] (<= 0 or >= V: all); top_p [R];
    u [R]; min_p [R] (0: off) -> ids [R]. Tokens in descending order; drop those less likely
    than min_p x the first (vLLM's order: min_p, then top-k and top-p), keep the top k, then
    the smallest head whose mass reaches top_p (at least one), renormalize, and invert the
    CDF at u."""
    v = scaled.shape[-1]
    ordered, order = torch.sort(scaled, dim=-1, descending=True)       # [R, V]
    rank = torch.arange(v, device=scaled.device)
    k = torch.where((top_k > 0) & (top_k < v), top_k, v)
    ordered = ordered.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    if min_p is not None:  # p_t >= min_p p_max: t's logit >= top + log(min_p) (-inf at 0: all stay)
        floor = ordered[:, :1] + torch.log(min_p.to(ordered.dtype))[:, None]  # [R, 1]
        ordered = ordered.masked_fill(ordered < floor, float("-inf"))
    probs = torch.softmax(ordered.double(), dim=-1)                    # [R, V]
    before = probs.cumsum(-1) - probs                                  # mass before each token
    probs = probs.masked_fill(before >= top_p[:, None].double(), 0.0)
    cdf = probs.cumsum(-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1).contiguous(), right=True)
    return order.gather(-1, pick.clamp_max(v - 1)).squeeze(-1)


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
