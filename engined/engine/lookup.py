"""What a sequence's own context drafts: prompt lookup (engined/engine/speculate.py verifies
the drafts and chooses how many).

Drafting is prompt lookup, in the prompt and the output so far: among the recent earlier
occurrences of the sequence's last 3 tokens (CANDIDATES of them), the one whose match runs
furthest back (up to MAX_MATCH tokens; the most recent on a tie), and the tokens that followed
it; else the last token just past where the last draft's copy stopped (an edit substitutes
or inserts a word, then copies on: offline on the edit turns 1.97x -> 2.01x, AMD EPYC); else
the last 2 tokens' most recent occurrence, else the last token's; else, for a last token
never seen before (a new name, a deeper indent), the copy past it as if it had replaced the
token after an earlier occurrence of the two before it (_substituted: offline on the edit
turns at this repository's step costs, AMD EPYC, 2.136x -> 2.157x in all, the median turn
2.10x -> 2.14x; prose 1.090x -> 1.085x). A long match picks
the right copy among several (edit turns, tiles: 60% -> 70% accepted, 1.54x -> 1.58x); how
many of its tokens are verified is the draft length's choice, by the match's length
(speculate.py).
The index holds three entries a position.
An agent's edit re-emits the function it rewrites, a tool call repeats paths from the
conversation: there the drafts are right. A request's `prediction` (OpenAI's Predicted
Outputs: the text the client expects back, e.g. the file being edited) is looked up too.
"""

NGRAM = 3  # the suffix looked up; shorter ones when it never occurred
CANDIDATES = 16  # recent occurrences of it compared for the longest match
MAX_MATCH = 32  # how far back a match is compared
WINDOW = 16384  # the last tokens of a long prompt that drafts are looked up in
NEAR_BEFORE, NEAR_AFTER = 2, 16  # the span around where the last copy stopped (_near_copy)
SUBSTITUTED_MATCH = 2  # tokens before a replaced one that must match (_substituted)


class PromptLookup:
    """The tokens that followed the earlier occurrence of the sequence's end that matches it
    longest (see the module's docstring)."""

    def __init__(self, prompt_ids: list[int], prediction: tuple[int, ...] = ()):
        # the prompt, then the output as it grows; a prediction (OpenAI's Predicted Outputs)
        # goes first, so its end never reads as the context of the reply's first token; its
        # first WINDOW tokens and the prompt's last WINDOW, all indexed
        self.tokens = [*prediction[:WINDOW], *prompt_ids[-WINDOW:]] if prediction else list(prompt_ids)
        self.num_prompt = len(self.tokens)
        self.last: dict[tuple[int, int], int] = {}  # 2-gram -> the position after it
        self.every: dict[tuple[int, ...], list[int]] = {}  # 3-gram -> each position after it
        self.every_token: dict[int, list[int]] = {}  # token -> each position after it
        # positions after n-grams indexed so far
        self.indexed = 1 if prediction else max(1, self.num_prompt - WINDOW)
        self.match = 0  # the length of the match behind the last draft (0: none)
        # where the last draft was copied from, and the length of tokens then
        self.source, self.drafted_at = -1, 0

    def draft(self, output_ids: list[int], k: int) -> list[int]:
        """Up to k tokens to follow prompt + output_ids ([] when nothing matches); `match`
        says how many tokens of the end matched there."""
        tokens = self.tokens
        tokens += output_ids[len(tokens) - self.num_prompt:]
        end = len(tokens)
        for after in range(self.indexed, end):  # the n-grams some known token followed
            self.every_token.setdefault(tokens[after - 1], []).append(after)
            if after >= 2:
                self.last[tuple(tokens[after - 2:after])] = after
            if after >= NGRAM:
                self.every.setdefault(tuple(tokens[after - NGRAM:after]), []).append(after)
        self.indexed = max(self.indexed, end)
        best, self.match = self._lookup(tokens, end)
        if best < 0:
            return []
        self.source, self.drafted_at = best, end
        return tokens[best:best + k]

    def _lookup(self, tokens: list[int], end: int) -> tuple[int, int]:
        """(the position whose tokens follow as the draft, the match's length), or (-1, 0)."""
        seen = self.every.get(tuple(tokens[end - NGRAM:])) if end >= NGRAM else None
        if seen:
            best, longest = seen[-1], -1
            for after in reversed(seen[-CANDIDATES:]):
                n = self._match_length(tokens, after, end, NGRAM)
                if n > longest:
                    best, longest = after, n
                    if n >= MAX_MATCH:  # no earlier one can match further back
                        break
            return best, longest
        near = self._near_copy(tokens, end)
        if near[0] >= 0:
            return near
        after = self.last.get(tuple(tokens[end - 2:])) if end >= 2 else None
        if after is not None:
            return after, 2
        seen = self.every_token.get(tokens[end - 1]) if end >= 1 else None
        if seen:
            return seen[-1], 1
        after = self._substituted(tokens, end)
        return (after, 1) if after >= 0 else (-1, 0)

    def _substituted(self, tokens: list[int], end: int) -> int:
        """Where the copy goes on if the last token (never seen before) replaced the token
        after an earlier occurrence of the one before it: among the recent such occurrences,
        the one whose match runs furthest back (the nearest on a tie), if that match is
        SUBSTITUTED_MATCH tokens at least; else -1."""
        seen = self.every_token.get(tokens[end - 2], ()) if end >= 2 else ()
        best, longest = -1, 0
        for after in reversed(seen[-CANDIDATES:]):
            if after + 1 < end - 1:  # not the occurrence just before the last token
                n = self._match_length(tokens, after, end - 1, 1)
                if n > longest:
                    best, longest = after + 1, n
        # two tokens matched at least: in prose, where most new tokens are new words after a
        # common one, a match of one drafted 237 tokens and 3 stood (offline, 5 prose turns)
        return best if longest >= SUBSTITUTED_MATCH else -1

    def _near_copy(self, tokens: list[int], end: int) -> tuple[int, int]:
        """Where the last copy would go on: the sequence's last token at or just past where
        the last draft's source stopped matching (a substituted or inserted word, then the
        copy resumes), the longest match first, the nearest on a tie."""
        if self.source < 0:
            return -1, 0
        stood = 0  # how far the tokens since that draft went on copying its source
        while self.drafted_at + stood < end and self.source + stood < self.drafted_at \
                and tokens[self.source + stood] == tokens[self.drafted_at + stood]:
            stood += 1
        resume = self.source + stood
        best, longest = -1, 0
        for after in range(max(1, resume - NEAR_BEFORE + 1), min(end, resume + NEAR_AFTER + 1)):
            if tokens[after - 1] == tokens[end - 1]:
                n = self._match_length(tokens, after, end, 1)
                if n > longest:
                    best, longest = after, n
        return best, longest

    @staticmethod
    def _match_length(tokens: list[int], after: int, end: int, n: int) -> int:
        """How many tokens before `after` equal the sequence's last (n already known, up to
        MAX_MATCH)."""
        while n < MAX_MATCH and n < after and tokens[after - 1 - n] == tokens[end - 1 - n]:
            n += 1
        return n
