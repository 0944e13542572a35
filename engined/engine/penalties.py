"""The logits a token is drawn from, adjusted by the request: vLLM's allowed_token_ids and
min_tokens, OpenAI's logit_bias, presence_penalty and frequency_penalty, and vLLM's
repetition_penalty, in vLLM's order:

    logits[t] = -inf for t outside allowed_token_ids (vLLM's), when given
    logits[t] = -inf for the stop tokens, while the output is shorter than min_tokens
    logits[t] += logit_bias[t]
    logits[t] = logits[t] / r if logits[t] > 0 else logits[t] * r   for t in prompt or output
    logits[t] -= frequency * count(t) + presence * (count(t) > 0)    count: in the output

Greedy rows too (the argmax of the adjusted logits). Logprobs stay the model's own (vLLM's
default, raw logprobs); a grammar's mask still applies after (sampler.sample_rows), and while
one masks, min_tokens gives way to it.

A sequence's counts live in a History on its device, kept up to date as tokens come, so a
step costs a few vector ops per adjusted row, not a pass over the prompt. Row r of a
speculating sequence is drawn after its first r drafts: its counts include them, the counts
plain decoding would have at that step, so its tokens stay those of decoding without drafts.
"""
import torch


class History:
    """One sequence's tensors on the logits' device, made at its first adjusted step: which
    tokens the prompt holds, how often each came in the output (updated as tokens come), and
    its bias and stop-token index tensors (made once, not each step: a 49k-entry logit_bias
    rebuilt per row and step cost ~70 ms a step)."""

    def __init__(self, seq, vocab: int, device: torch.device):
        p = seq.params
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)     # [V]
        if p.repetition_penalty != 1.0:
            self.in_prompt[_ids(seq.prompt_ids, vocab, device)] = True
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)     # [V] output
        self.num_counted = 0
        bias = [(t, b) for t, b in p.logit_bias if 0 <= t < vocab]
        self.bias_ids = _ids([t for t, _ in bias], vocab, device)                # [N]
        self.bias = torch.tensor([b for _, b in bias], dtype=torch.float32, device=device)
        self.stop_ids = _ids(sorted(p.stop_token_ids), vocab, device)            # [S]
        self.barred = None                                                      # [V] bool
        if p.allowed_token_ids:
            self.barred = torch.ones(vocab, dtype=torch.bool, device=device)
            self.barred[_ids(sorted(p.allowed_token_ids), vocab, device)] = False

    def counted(self, output_ids: list[int]) -> torch.Tensor:
        """counts after output_ids (the sequence's output so far; it only grows)."""
        new = output_ids[self.num_counted:]
        if new:
            self._add(self.counts, new)
            self.num_counted = len(output_ids)
        return self.counts

    def _add(self, counts: torch.Tensor, ids: list[int]):
        ids_t = _ids(ids, counts.shape[0], counts.device)
        counts.index_add_(0, ids_t, torch.ones(ids_t.shape[0], device=counts.device))

    def with_drafts(self, output_ids: list[int], drafts: list[int]) -> torch.Tensor:
        """The counts plain decoding has once these drafts have been accepted."""
        counts = self.counted(output_ids)
        if not drafts:
            return counts
        counts = counts.clone()
        self._add(counts, drafts)
        return counts


def _ids(ids, vocab: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([i for i in ids if 0 <= i < vocab], dtype=torch.int64).to(device)


def adjusted(logits: torch.Tensor, rows: list[tuple[object, int]]) -> torch.Tensor:
    """logits: [R, V], row i drawn for rows[i] = (sequence, r): its r-th row this step (r
    drafts before it) -> the logits to draw from: the same tensor when no row's request
    adjusts them, else a copy (fp32) with those rows adjusted."""
    if not any(_adjusts(seq, r) for seq, r in rows):
        return logits
    out = logits.float().clone()
    vocab = out.shape[-1]
    for i, (seq, r) in enumerate(rows):
        p = seq.params
        if not _adjusts(seq, r):
            continue
        if seq.history is None:
            seq.history = History(seq, vocab, out.device)
        history, row = seq.history, out[i]                                 # row: [V], a view
        if history.barred is not None:
            row.masked_fill_(history.barred, float("-inf"))
        if _too_soon(seq, r):
            row[history.stop_ids] = float("-inf")
        if p.logit_bias:
            row.index_add_(0, history.bias_ids, history.bias)
        if not p.penalizes:
            continue
        counts = history.with_drafts(seq.output_ids, seq.draft[:r])        # [V] output counts
        if p.repetition_penalty != 1.0:
            seen = history.in_prompt | (counts > 0)
            penalized = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
            row.copy_(torch.where(seen, penalized, row))
        if p.frequency_penalty:
            row.sub_(p.frequency_penalty * counts)
        if p.presence_penalty:
            row.sub_(p.presence_penalty * (counts > 0).float())
    return out


def _too_soon(seq, r: int) -> bool:
    """Row r comes before min_tokens output tokens: its stop tokens cannot be drawn. Not
    while a grammar masks the output (a tool call woken in an answer with tools): the
    grammar decides where it ends, and both masks together could leave no token."""
    p = seq.params
    return (len(seq.output_ids) + r < p.min_tokens and bool(p.stop_token_ids)
            and not (seq.grammar is not None and seq.grammar.is_masking))


def _adjusts(seq, r: int) -> bool:
    p = seq.params
    return p.penalizes or bool(p.logit_bias) or bool(p.allowed_token_ids) or _too_soon(seq, r)
