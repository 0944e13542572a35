"""Draft-free speculative decoding: a sequence's own context drafts its next tokens, and one
decode step checks them.

Drafting is prompt lookup (engined/engine/lookup.py, PromptLookup): the tokens that followed an
earlier occurrence of the sequence's end, in the prompt, the output so far, or a request's
`prediction` (OpenAI's Predicted Outputs).

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

The draft length is chosen each step from what the drafts behind such a match did before.
Acceptance is counted by the length of the match behind the draft (MATCH_BUCKETS: 1, 2, 3,
4-7, 8-15, 16+ tokens) and by the draft's place: how often draft j stood when drafts 1..j-1
had. A sequence keeps its own counts, with the engine's counts for its kind (greedy or
sampled) as their prior, and the engine's start from PRIOR_FIRST and PRIOR_NEXT (the edit
turns' measured rates, rounded). The step's cost, relative to a one-row step, is measured per
row count (StepCost: the lower quartile of recent step times; a line through them where a
count has too few). The k in 0..K_MAX with the most expected tokens per unit of time wins:
(1 + p_1 + p_1 p_2 + ... + p_1..p_k) over cost(k + 1). Where the match's rates say k = 0, the
sequence drafts nothing, and after COOLDOWN such steps in a row it probes with one draft.
Against a draft length learned from the acceptance rate alone (one rate for every match,
short matches capped at 1 and 3 drafts), offline on the edit turns at this repository's
measured step costs: EPYC 1.79x -> 1.83x, Intel 1.58x -> 1.70x, prose 1.01x -> 1.06x.
"""
import collections
import time

from engined.engine.lookup import PromptLookup

K_MAX = 7  # drafts per sequence and step: with its input token, 8 rows (one GEMV pass)
MATCH_BUCKETS = (1, 2, 3, 4, 8, 16)  # match lengths from which acceptance is counted apart
PRIOR_FIRST = (0.25, 0.5, 0.7, 0.8, 0.9, 0.95)  # the first draft's acceptance, per bucket
PRIOR_NEXT = 0.85  # a later draft's, given the one before it stood
PRIOR_WEIGHT = 4.0  # the priors count as this many drafts tested
SEQ_WEIGHT = 8.0  # the engine's rates count as this many of a sequence's own tests
SEQ_DECAY = 0.95  # weight of a sequence's past counts per draft tested at a place: a long
# answer can turn from copying code to prose
ENGINE_DECAY = 0.995  # the same for the engine's counts
COOLDOWN = 16  # steps choosing no draft, in a row, before a probe with one
PRIOR_BETA = 0.4  # one more row's cost relative to a one-row step, before any measurement


def match_bucket(match: int) -> int:
    """The MATCH_BUCKETS index of a match of `match` tokens (>= 1)."""
    return sum(match >= least for least in MATCH_BUCKETS[1:])


class Acceptance:
    """Drafts tested and drafts that stood, per match bucket and place in the draft (draft j
    is tested when drafts 1..j-1 stood). rate(b, j) = stood / tested, with `prior` (another
    Acceptance, or None for PRIOR_FIRST and PRIOR_NEXT) counted as `weight` tests."""

    def __init__(self, prior: "Acceptance | None" = None, weight: float = PRIOR_WEIGHT,
                 decay: float = 1.0):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.stood = [[0.0] * K_MAX for _ in MATCH_BUCKETS]
        self.tested = [[0.0] * K_MAX for _ in MATCH_BUCKETS]

    def rate(self, bucket: int, place: int) -> float:
        prior = (self.prior.rate(bucket, place) if self.prior is not None
                 else PRIOR_FIRST[bucket] if place == 0 else PRIOR_NEXT)
        return ((self.stood[bucket][place] + self.weight * prior)
                / (self.tested[bucket][place] + self.weight))

    def verified(self, bucket: int, drafted: int, accepted: int):
        for place in range(min(accepted + 1, drafted)):
            self.tested[bucket][place] = self.decay * self.tested[bucket][place] + 1
            self.stood[bucket][place] = self.decay * self.stood[bucket][place] + (place < accepted)
        if self.prior is not None:
            self.prior.verified(bucket, drafted, accepted)


class DraftLength:
    """One sequence's draft length (the module's docstring), and what it drafted and got
    accepted. engine: the engine's Acceptance for sequences of this kind."""

    def __init__(self, engine: "Acceptance | None" = None):
        self.acceptance = Acceptance(engine if engine is not None else Acceptance(), SEQ_WEIGHT,
                                     SEQ_DECAY)
        self.bucket = 0  # the bucket of the draft being verified
        self.idle = 0  # steps in a row that chose no draft
        self.num_drafted = self.num_accepted = self.num_steps = 0

    def choose(self, match: int, available: int, cost: tuple[float, ...]) -> int:
        """How many of `available` drafts behind a match of `match` tokens to verify; cost[r]:
        a step of r rows relative to one row (r = 1..K_MAX + 1)."""
        if available <= 0 or match <= 0:
            return 0
        self.bucket = match_bucket(match)
        best, best_value, expected, survive = 0, 1.0 / cost[1], 1.0, 1.0
        for k in range(1, min(available, K_MAX) + 1):
            survive *= self.acceptance.rate(self.bucket, k - 1)
            expected += survive
            if expected / cost[k + 1] > best_value:
                best, best_value = k, expected / cost[k + 1]
        self.idle = 0 if best else self.idle + 1
        if self.idle > COOLDOWN:  # a probe: the rates may be stale
            self.idle, best = 0, 1
        return best

    def verified(self, drafted: int, accepted: int):
        """accepted of drafted stood; a shortfall means one was tested and rejected."""
        self.num_drafted += drafted
        self.num_accepted += accepted
        self.num_steps += 1
        self.acceptance.verified(self.bucket, drafted, accepted)


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
    """Decode step seconds against rows -> the cost of a step of r rows relative to one row.
    Per row count, the lower quartile of its recent times (a busy host only adds time); a
    least-squares line through those stands in for a count with fewer than 3 times."""

    def __init__(self, size: int = 256):
        self.samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=size)
        self.num_timed = 0

    def timed(self, rows: int, started: float):
        self.samples.append((rows, time.perf_counter() - started))
        self.num_timed += 1

    @property
    def relative(self) -> tuple[float, ...]:
        """cost[r] for r = 0..K_MAX + 1 (cost[0] unused, cost[1] = 1), never falling as r grows."""
        by_rows = collections.defaultdict(list)
        for rows, seconds in self.samples:
            by_rows[rows].append(seconds)
        points = {r: sorted(ts)[len(ts) // 4] for r, ts in by_rows.items() if len(ts) >= 3}
        line = self._line(list(points.items()))
        if 1 not in points and line is None:
            return prior_cost()
        times = [points[1] if 1 in points else line[0] + line[1]]
        for r in range(2, K_MAX + 2):  # unmeasured: the line, else (rows free) the count below
            fitted = line[0] + line[1] * r if line else times[-1]
            times.append(max(points.get(r, fitted), times[-1]))
        return (0.0, *(t / times[0] for t in times))

    @staticmethod
    def _line(points: list[tuple[int, float]]) -> tuple[float, float] | None:
        """(fixed, per_row) through the points, or None while they cannot say (fewer than
        two, or a line that does not rise: on a GPU an extra row may cost nothing)."""
        if len(points) < 2:
            return None
        n = len(points)
        mean_r, mean_t = sum(r for r, _ in points) / n, sum(t for _, t in points) / n
        var = sum((r - mean_r) ** 2 for r, _ in points)
        per_row = sum((r - mean_r) * (t - mean_t) for r, t in points) / var
        fixed = mean_t - per_row * mean_r
        if per_row <= 0 or fixed + per_row <= 0:
            return None
        return fixed, per_row


def prior_cost() -> tuple[float, ...]:
    """StepCost.relative before any measurement: PRIOR_BETA a row."""
    return (0.0, *(1 + PRIOR_BETA * (r - 1) for r in range(1, K_MAX + 2)))


class Speculator:
    """The engine's drafting and bookkeeping: drafts for a decode step, the verdicts after."""

    def __init__(self, metrics):
        self.metrics, self.cost = metrics, StepCost()
        self.acceptance = {greedy: Acceptance(decay=ENGINE_DECAY) for greedy in (True, False)}
        self._relative, self._relative_at = prior_cost(), 0

    def draft(self, seq) -> list[int]:
        """Up to K_MAX tokens for seq to verify this step ([]: decode one token). Under a
        grammar, the head of the draft the grammar accepts (its rows are masked one by one,
        GrammarMatcher.draft_rows)."""
        if not seq.params.speculative:
            return []
        if seq.spec is None:
            seq.spec = (PromptLookup(seq.prompt_ids, seq.params.prediction_ids),
                        DraftLength(self.acceptance[seq.params.is_greedy]))
        lookup, length = seq.spec
        limit = min(K_MAX, seq.params.max_tokens - len(seq.output_ids) - 1)
        draft = lookup.draft(seq.output_ids, limit) if limit > 0 else []
        draft = draft[:length.choose(lookup.match, len(draft), self.relative)]
        return seq.grammar.accepted_draft(draft) if seq.grammar is not None else draft

    def verified(self, seq, drafted: int, accepted: int):
        seq.spec[1].verified(drafted, accepted)
        self.metrics.spec_draft_tokens.inc(drafted)
        self.metrics.spec_accepted_tokens.inc(accepted)

    @property
    def relative(self) -> tuple[float, ...]:
        if self.cost.num_timed >= self._relative_at + 16:  # refitted every 16 steps
            self._relative, self._relative_at = self.cost.relative, self.cost.num_timed
        return self._relative
