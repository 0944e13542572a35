"""The end of a degenerate loop, or of the token budget, in a JSON reply under a grammar.

Greedy, a small model can repeat a span for as long as it is let: inside a JSON string
(`"prompt": "Cron: Cron: Cron: ...`), or as array items or object keys without end
(measured on SmolLM2-135M: 15 of 50 forced tool calls and 4 of 30 schema replies ran to
max_tokens so). A grammar keeps every token legal but cannot end a loop; with an agent's
max_tokens (Claude Code asks 32,000) the loop runs for minutes and its call never closes.

So while a JSON schema or a tool-call grammar constrains a reply, a loop puts the reply in
closing mode: a tail of at least LOOP_TOKENS tokens that repeats one span of at most
MAX_PERIOD tokens three times or more, or a near-repeat (`"label": "Question 1"}, ...
"Question 2"}, ...`: of the last WINDOW tokens, NEAR or more equal the token one period of
at most WINDOW / 3 tokens back). In closing mode from then on each mask is narrowed, whenever the grammar
allows one, to the tokens that only close: inside a string, a token of `"` then `]` or `}`
only; outside, a token of `]` and `}` only, or an end of the reply. The string, the array,
the object and the call end at the grammar's first chance, and the reply parses. Where no
closer is allowed yet (a required key still missing, a number's digits) the grammar's mask
stands. Whether the reply is inside a string is read from its bytes (JSON's own lexing:
quotes and backslash escapes), as the grammars around the JSON (hermes' <tool_call> text,
Kimi's marker tokens) hold no quote. Nothing changes before such a loop, nor without a
JSON grammar (a regex, a choice, a Lark grammar such as apply_patch's).

The budget closes a reply the same way: cut at max_tokens, a call or a JSON reply would not
parse (measured: 2 of 50 forced tool calls, and every one of 20 apply_patch calls at 128
tokens). So once no more than RESERVE tokens (a quarter of a small max_tokens) are left, the
reply is in closing mode too. A string whose pattern only accepts after a literal tail
(apply_patch's `*** End Patch`, closing.py) has no closer until then: where the grammar
accepts one of the closing texts whole, the first of them is written (the mask narrowed to its
tokens one by one), and the string's `"` follows.
"""
from __future__ import annotations

import collections
import copy

import torch

LOOP_TOKENS = 64   # a repeating tail this long at least, of
MAX_PERIOD = 64    # a span of at most this many tokens, repeated 3 times at least
WINDOW, NEAR = 128, 0.85  # a near-repeat: this share of the last WINDOW tokens
RESERVE = 24       # budget closing starts with this many tokens left (a JSON tail, a closing
#                    text, hermes' </tool_call> and the end token fit in it)
QUOTE, BACKSLASH = ord('"'), ord("\\")
CLOSE = frozenset(b"]}")


def closer_bitmasks(token_bytes: list[bytes], end_ids=()) -> torch.Tensor:
    """[2, W] int32 in llguidance's mask layout (bit j of word w: token 32w+j): row 0 the
    tokens that close from inside a string (`"`, then only `]` or `}`), row 1 those that
    close from outside one (only `]` and `}`; and end_ids, the tokens that end a reply)."""
    words = [[0] * ((len(token_bytes) + 31) // 32) for _ in range(2)]
    for token, text in enumerate(token_bytes):
        inside = text[:1] == b'"' and all(b in CLOSE for b in text[1:])
        outside = (text and all(b in CLOSE for b in text)) or token in end_ids
        for row, is_closer in ((0, inside), (1, outside)):
            if is_closer:
                words[row][token // 32] |= 1 << (token % 32)
    return torch.tensor(words, dtype=torch.int64).to(torch.int32)


class LoopGuard:
    """Watches one constrained reply's tokens (push) and narrows its masks (narrow), both on
    the grammar thread, each push before the narrow of the mask that follows it."""

    def __init__(self, closers: torch.Tensor, token_bytes, limit: int = LOOP_TOKENS,
                 budget: int | None = None, plans: tuple[list[int], ...] = ()):
        """closers: closer_bitmasks' [2, W]; token_bytes: token id -> its bytes; budget: the
        reply's max_tokens (None: no budget closing); plans: closing texts as token ids, the
        grammar's first choice first."""
        self.closers, self.token_bytes, self.limit = closers, token_bytes, limit
        self.reserve = None if budget is None else min(RESERVE, budget // 4)
        self.plans, self._plan, self._planning, self._spent = plans, [], -1, set()
        self.is_closing = False
        self.why = ""          # "loop" or "budget", once closing
        self.num_narrowed = 0  # masks narrowed to closers
        self.in_string = self._escaped = False
        self._tail: collections.deque[int] = collections.deque(maxlen=MAX_PERIOD)
        self._runs = [0] * (MAX_PERIOD + 1)  # runs[p]: trailing tokens equal to the one p back
        self._window: collections.deque[int] = collections.deque(maxlen=WINDOW)  # per token:
        self._counts = [0] * (MAX_PERIOD + 1)  # bit p-1 when equal to the one p back; their sums

    def fork(self) -> "LoopGuard":
        """A copy that reads tokens on its own (a speculative draft's rows)."""
        twin = copy.copy(self)
        twin._tail, twin._window = self._tail.copy(), self._window.copy()
        twin._runs, twin._counts = list(self._runs), list(self._counts)
        twin._plan, twin._spent = list(self._plan), set(self._spent)
        return twin

    def left(self, num_tokens: int):
        """The reply may write num_tokens more: at the reserve or below, it closes."""
        if not self.is_closing and self.reserve is not None and num_tokens <= self.reserve:
            self.is_closing, self.why = True, "budget"

    def push(self, token_id: int):
        if self._plan:
            if token_id != self._plan[0]:
                self._plan = []
            else:
                self._plan = self._plan[1:]
                if not self._plan:  # written to its end
                    self._spent.add(self._planning)
        for byte in self.token_bytes(token_id):
            if self._escaped:
                self._escaped = False
            elif self.in_string and byte == BACKSLASH:
                self._escaped = True
            elif byte == QUOTE:
                self.in_string = not self.in_string
        if self.is_closing:
            return
        tail, runs, counts, bits = self._tail, self._runs, self._counts, 0
        if len(self._window) == WINDOW:
            gone = self._window[0]
            for p in range(1, MAX_PERIOD + 1):
                counts[p] -= gone >> (p - 1) & 1
        for p in range(1, min(len(tail), MAX_PERIOD) + 1):
            if tail[-p] == token_id:
                bits |= 1 << (p - 1)
                counts[p] += 1
        for p in range(1, MAX_PERIOD + 1):
            runs[p] = runs[p] + 1 if bits >> (p - 1) & 1 else 0
        tail.append(token_id)
        self._window.append(bits)
        is_full = len(self._window) == WINDOW
        if any(run + p >= max(self.limit, 3 * p) for p, run in enumerate(runs) if run) \
                or (is_full and max(counts[1:WINDOW // 3 + 1]) >= NEAR * WINDOW):
            self.is_closing, self.why = True, "loop"

    def narrow(self, bitmask: torch.Tensor, matcher=None) -> bool:
        """bitmask [1, W]: the grammar's next mask, narrowed in place in closing mode to its
        closers, when the grammar allows one now, else to the next token of a closing text
        that `matcher` (llguidance's, at this point of the reply) accepts whole.
        -> whether it was."""
        if not self.is_closing:
            return False
        closing = bitmask & self.closers[0 if self.in_string else 1]
        if self._escaped or not bool(closing.any()):  # after a backslash a quote is text
            token = self._planned(matcher)
            if token is None:
                return False
            closing = torch.zeros_like(bitmask)
            closing[0, token // 32] = bitmask[0, token // 32] & _bit(token % 32)
            if not bool(closing.any()):
                self._plan = []
                return False
        bitmask.copy_(closing)
        self.num_narrowed += 1
        return True

    def _planned(self, matcher) -> int | None:
        """The next token of the closing text under way, else of the first the grammar accepts
        whole that was not written to its end before (it did not close then: the text can be
        content, as `*** End Patch` inside a patch line)."""
        if not self._plan and matcher is not None:
            at = next((i for i, p in enumerate(self.plans) if i not in self._spent and p
                       and matcher.validate_tokens(p) == len(p)), None)
            if at is not None:
                self._plan, self._planning = list(self.plans[at]), at
        return self._plan[0] if self._plan else None


def _bit(j: int) -> int:
    """Bit j of an int32 word, as the signed value torch stores."""
    return (1 << j) - (1 << 32 if j == 31 else 0)
