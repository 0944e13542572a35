"""Draft-free speculative decoding: a sequence's own context drafts its next tokens, and one
decode step checks them.

Drafting is prompt lookup, in the prompt and the output so far: among the recent earlier
occurrences of the sequence's last 3 tokens (CANDIDATES of them), the one whose match runs
furthest back (up to MAX_MATCH tokens; the most recent on a tie), and the tokens that followed
it; else the last 2 tokens' most recent occurrence (at most 3 drafted), else the last token's
(at most 1): short matches were the drafts most often wrong, and a long one picks the right
copy among several (edit turns, tiles: 60% -> 70% accepted, 1.54x -> 1.58x). The index holds
three entries a position, as the 3-gram lookup before it did.
An agent's edit re-emits the function it rewrites, a tool call repeats paths from the
conversation: there the drafts are right.

Verification is one decode_batch over the input token and its k drafts, at positions p..p+k
of the sequence's own cache, beside the other sequences' rows. A model may offer that only
when each such row equals a lone decode step bit for bit (Model.verifies_drafts), so the
draws are the draws the plain decode makes: the sampler's draw at a position is a pure
function of (logits, seed, position), and draft j+1 stands only if the draw after draft j
equals it. Greedy or seeded, the tokens are those of decoding without speculation. The next
step starts after the last accepted token: cache rows past it are overwritten before anything
reads them (Llama's KV, Kimi-Linear's latents), a recurrent state is the one that row left
(Kimi-Linear keeps each row's KDA state in a slot of its own: models/kimi_cache.py), and the
prefix cache stores prompt chunks only.

The draft length adapts per sequence. The acceptance rate a (per drafted token, decayed)
and the step's cost model (a decode step of R rows takes fixed + per_row * R seconds, fitted
through the lower quartile of recent step times per row count) pick the k in 0..K_MAX with the most tokens per unit of time,
(1 - a^(k+1)) / (1 - a) over 1 + beta * k, beta = per_row / (fixed + per_row). When that is
k = 0 (acceptance under the break-even), the sequence stops drafting for COOLDOWN steps, then
probes with one draft.
"""
import collections
import time

K_MAX = 7  # drafts per sequence and step: with its input token, 8 rows (one GEMV pass)
NGRAM = 3  # the suffix looked up; shorter ones when it never occurred
CANDIDATES = 16  # recent occurrences of it compared for the longest match
MAX_MATCH = 32  # how far back a match is compared
SHORT_MATCH = {1: 1, 2: 3}  # the most drafted after a match of only n tokens
WINDOW = 16384  # the last tokens of a long prompt that drafts are looked up in
COOLDOWN = 16  # steps without drafting after acceptance fell below the break-even
DECAY = 0.8  # weight of the past in the acceptance rate, per verification
PRIOR_ACCEPTED, PRIOR_TESTED = 1.2, 2.0  # an acceptance rate of 0.6 before any evidence
PRIOR_BETA = 0.4  # one more row's cost relative to a one-row step, before any measurement


class PromptLookup:
    """The tokens that followed the earlier occurrence of the sequence's end that matches it
    longest (see the module's docstring)."""

    def __init__(self, prompt_ids: list[int]):
        self.tokens = list(prompt_ids)  # the prompt, then the output as it grows
        self.num_prompt = len(self.tokens)
        self.last: dict[tuple[int, ...], int] = {}  # 1- and 2-gram -> the position after it
        self.every: dict[tuple[int, ...], list[int]] = {}  # 3-gram -> each position after it
        self.indexed = max(1, self.num_prompt - WINDOW)  # positions after n-grams indexed so far

    def draft(self, output_ids: list[int], k: int) -> list[int]:
        """Up to k tokens to follow prompt + output_ids ([] when nothing matches)."""
        tokens = self.tokens
        tokens += output_ids[len(tokens) - self.num_prompt:]
        end = len(tokens)
        for after in range(self.indexed, end):  # the n-grams some known token followed
            self.last[(tokens[after - 1],)] = after
            if after >= 2:
                self.last[tuple(tokens[after - 2:after])] = after
            if after >= NGRAM:
                self.every.setdefault(tuple(tokens[after - NGRAM:after]), []).append(after)
        self.indexed = max(self.indexed, end)
        seen = self.every.get(tuple(tokens[end - NGRAM:])) if end >= NGRAM else None
        if seen:
            best, longest = seen[-1], -1
            for after in reversed(seen[-CANDIDATES:]):
                n = NGRAM
                while n < MAX_MATCH and n < after and tokens[after - 1 - n] == tokens[end - 1 - n]:
                    n += 1
                if n > longest:
                    best, longest = after, n
            return tokens[best:best + k]
        for n in (2, 1):
            after = self.last.get(tuple(tokens[end - n:])) if end >= n else None
            if after is not None:
                return tokens[after:after + min(k, SHORT_MATCH[n])]
        return []


class DraftLength:
    """One sequence's adaptive draft length, and what it drafted and got accepted."""

    def __init__(self):
        self.accepted, self.tested = PRIOR_ACCEPTED, PRIOR_TESTED
        self.cooldown = 0
        self.num_drafted = self.num_accepted = self.num_steps = 0

    def choose(self, beta: float, limit: int) -> int:
        if limit <= 0:
            return 0
        if self.cooldown:
            self.cooldown -= 1
            return 1 if self.cooldown == 0 else 0  # the probe after a cooldown
        rate = min(self.accepted / self.tested, 0.999)
        best = max(range(K_MAX + 1), key=lambda k: (1 - rate ** (k + 1)) / (1 - rate) / (1 + beta * k))
        if best == 0:
            self.cooldown = COOLDOWN
        return min(best, limit)

    def verified(self, drafted: int, accepted: int):
        """accepted of drafted stood; a shortfall means one was tested and rejected."""
        self.num_drafted += drafted
        self.num_accepted += accepted
        self.num_steps += 1
        self.accepted = DECAY * self.accepted + accepted
        self.tested = DECAY * self.tested + accepted + (accepted < drafted)


def request_metrics(length: "DraftLength | None") -> dict:
    """vLLM's per-request speculative decoding summary (its response's
    metrics.speculative_decoding): drafts, accepted drafts, verifying steps, the acceptance
    rate and the mean tokens a verifying step yielded."""
    drafted, accepted, steps = ((length.num_drafted, length.num_accepted, length.num_steps)
                                if length else (0, 0, 0))
    return {"num_spec_steps": steps, "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_acceptance_length": 1 + accepted / steps if steps else 0.0}


class StepCost:
    """Decode step seconds against rows -> beta. Per row count, the lower quartile of its
    recent times (a busy host only adds time), then a least-squares line through those."""

    def __init__(self, size: int = 256):
        self.samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=size)
        self.num_timed = 0

    def timed(self, rows: int, started: float):
        self.samples.append((rows, time.perf_counter() - started))
        self.num_timed += 1

    @property
    def beta(self) -> float:
        by_rows = collections.defaultdict(list)
        for rows, seconds in self.samples:
            by_rows[rows].append(seconds)
        points = [(r, sorted(ts)[len(ts) // 4]) for r, ts in by_rows.items() if len(ts) >= 3]
        if len(points) < 2:
            return PRIOR_BETA
        n = len(points)
        mean_r, mean_t = sum(r for r, _ in points) / n, sum(t for _, t in points) / n
        var = sum((r - mean_r) ** 2 for r, _ in points)
        per_row = sum((r - mean_r) * (t - mean_t) for r, t in points) / var
        fixed = mean_t - per_row * mean_r
        if per_row <= 0 or fixed + per_row <= 0:
            return PRIOR_BETA
        return min(max(per_row / (fixed + per_row), 0.01), 1.0)


class Speculator:
    """The engine's drafting and bookkeeping: drafts for a decode step, the verdicts after."""

    def __init__(self, metrics):
        self.metrics, self.cost = metrics, StepCost()
        self._beta, self._beta_at = PRIOR_BETA, 0

    def draft(self, seq) -> list[int]:
        """Up to K_MAX tokens for seq to verify this step ([]: decode one token). Under a
        grammar, the head of the draft the grammar accepts (its rows are masked one by one,
        GrammarMatcher.draft_rows)."""
        if not seq.params.speculative:
            return []
        if seq.spec is None:
            seq.spec = (PromptLookup(seq.prompt_ids), DraftLength())
        lookup, length = seq.spec
        k = length.choose(self.beta, seq.params.max_tokens - len(seq.output_ids) - 1)
        draft = lookup.draft(seq.output_ids, k) if k else []
        return seq.grammar.accepted_draft(draft) if seq.grammar is not None else draft

    def verified(self, seq, drafted: int, accepted: int):
        seq.spec[1].verified(drafted, accepted)
        self.metrics.spec_draft_tokens.inc(drafted)
        self.metrics.spec_accepted_tokens.inc(accepted)

    @property
    def beta(self) -> float:
        if self.cost.num_timed >= self._beta_at + 16:  # refitted every 16 steps
            self._beta, self._beta_at = self.cost.beta, self.cost.num_timed
        return self._beta
