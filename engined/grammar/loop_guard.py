"""The end of a degenerate loop in a JSON reply under a grammar.

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
"""
from __future__ import annotations

import collections

import torch

LOOP_TOKENS = 64   # a repeating tail this long at least, of
MAX_PERIOD = 64    # a span of at most this many tokens, repeated 3 times at least
WINDOW, NEAR = 128, 0.85  # a near-repeat: this share of the last WINDOW tokens
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

    def __init__(self, closers: torch.Tensor, token_bytes, limit: int = LOOP_TOKENS):
        """closers: closer_bitmasks' [2, W]; token_bytes: token id -> its bytes."""
        self.closers, self.token_bytes, self.limit = closers, token_bytes, limit
        self.is_closing = False
        self.num_narrowed = 0  # masks narrowed to closers
        self.in_string = self._escaped = False
        self._tail: collections.deque[int] = collections.deque(maxlen=MAX_PERIOD)
        self._runs = [0] * (MAX_PERIOD + 1)  # runs[p]: trailing tokens equal to the one p back
        self._window: collections.deque[int] = collections.deque(maxlen=WINDOW)  # per token:
        self._counts = [0] * (MAX_PERIOD + 1)  # bit p-1 when equal to the one p back; their sums

    def push(self, token_id: int):
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
        self.is_closing = any(run + p >= max(self.limit, 3 * p) for p, run in enumerate(runs) if run) \
            or (is_full and max(counts[1:WINDOW // 3 + 1]) >= NEAR * WINDOW)

    def narrow(self, bitmask: torch.Tensor) -> bool:
        """bitmask [1, W]: the grammar's next mask, narrowed in place to its closers in
        closing mode, when the grammar allows one now. -> whether it was."""
        if not self.is_closing:
            return False
        closing = bitmask & self.closers[0 if self.in_string else 1]
        if not bool(closing.any()):
            return False
        bitmask.copy_(closing)
        self.num_narrowed += 1
        return True
