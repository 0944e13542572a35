"""One request's grammar while it decodes, and the mask it puts on the logits.

The model thread calls `advance(token)` after each sampled token; that consumes the token and
hands the next mask's computation to the grammar worker thread (llguidance drops the GIL),
so the mask for step t+1 is computed while the forward of step t+1 runs. `masked()` then
waits for it (usually already done), unpacks the bits on the logits' device and sets every
token the grammar forbids to -inf, in the rows used to draw only: logprobs stay those of
the model's raw distribution.

A lazy grammar (tool_choice auto) sleeps until its trigger shows up in the output: a text
trigger (hermes "<tool_call>") is looked for in the output bytes, then the bytes from the
trigger on are fed to the grammar; token triggers (Kimi's section-begin and call-begin
tokens) wake it on that token. Before the trigger nothing is masked, so free text is exactly what an
unconstrained run writes. A grammar that errors (it cannot happen with masks applied, but a
lazy grammar may meet a malformed opener) stops masking and is logged.
"""
from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from dataclasses import dataclass

from typing import TYPE_CHECKING

import torch

from engined.grammar.loop_guard import LoopGuard

if TYPE_CHECKING:  # the sampler imports this module on every image; the GPU image has
    #                neither llguidance nor numpy until a grammar is used (serve_without_gguf)
    from engined.grammar.compile import Compiled

_worker: concurrent.futures.ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


def worker() -> concurrent.futures.ThreadPoolExecutor:
    """The grammar thread, started with the first grammar (never at import)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kimi-grammar")
        return _worker


@dataclass(frozen=True)
class Trigger:
    """What wakes a lazy grammar: `text` in the output bytes, or one of `token_ids`."""
    text: bytes = b""
    token_ids: frozenset[int] = frozenset()


class GrammarMatcher:
    def __init__(self, compiled: Compiled, ll_tokenizer, trigger: Trigger | None = None,
                 log=print, closers: torch.Tensor | None = None, budget: int | None = None,
                 closing_texts: tuple[str, ...] = ()):
        """closers: loop_guard.closer_bitmasks of the tokenizer, for a JSON grammar: its
        degenerate loops, and its budget of `budget` tokens (the reply's max_tokens, lazy
        text included), are ended (None: the masks are the grammar's alone); closing_texts:
        closing.closing_texts of its schemas."""
        self.matcher = compiled.new_matcher()
        plans = tuple(ll_tokenizer.tokenize_str(json.dumps(text)[1:-1])  # inside a JSON string
                      for text in closing_texts)
        self.guard = None if closers is None else \
            LoopGuard(closers, lambda token: ll_tokenizer.decode_bytes([token]), budget=budget,
                      plans=plans)
        self._left = budget  # tokens the reply may still write
        self.ll, self.trigger, self.log = ll_tokenizer, trigger, log
        self.is_active = trigger is None
        self.is_failed = False
        self.bitmask = torch.full((1, (ll_tokenizer.vocab_size + 31) // 32), -1, dtype=torch.int32)
        self._seen = bytearray()  # output bytes while asleep (text trigger)
        self._pending: concurrent.futures.Future | None = None
        self.mask_ms = 0.0
        self.num_masks = self.num_ready = 0  # masks applied; of them, ready before the logits
        self.total_mask_ms = 0.0
        if self.is_active:
            self._compute_next()

    @property
    def is_masking(self) -> bool:
        return self.is_active and not self.is_failed

    def advance(self, token_id: int):
        """The sampled token: wake on the trigger, or consume it and start the next mask."""
        if self.is_failed:
            return
        if self._left is not None:
            self._left -= 1
        if not self.is_active:
            return self._watch(token_id)
        self._wait()
        if not self.matcher.consume_token(token_id):
            return self._fail(f"token {token_id} refused: {self.matcher.get_error()}")
        self._compute_next((token_id,))

    def mask(self) -> tuple[torch.Tensor, float, bool]:
        """-> (bitmask [1, W] int32 on the CPU, ms its computation took, whether it was
        ready before the logits)."""
        is_ready = self._pending is None or self._pending.done()
        self._wait()
        if self.matcher.is_error():  # e.g. a parser limit met while computing this mask
            self._fail(f"no mask: {self.matcher.get_error()}")
        self.num_masks, self.num_ready = self.num_masks + 1, self.num_ready + is_ready
        self.total_mask_ms += self.mask_ms
        return self.bitmask, self.mask_ms, is_ready

    def accepted_draft(self, draft: list[int]) -> list[int]:
        """The head of a speculative draft whose rows draft_rows can mask as the token-by-token
        decode would: what the grammar accepts; asleep, the tokens before one that wakes it."""
        if self.is_failed or not draft:
            return draft
        if not self.is_active:
            return draft[:self._wakes_at(draft)]
        self._wait()
        return draft[:self.matcher.validate_tokens(draft)]

    def draft_rows(self, draft: list[int]) -> list:
        """For the k + 1 rows that verify an accepted_draft: row j masked as after draft[:j]
        (the loop guard and the budget included), on a copy of the matcher and of the guard:
        the request's own are left as they were."""
        if not self.is_masking or not draft:
            return [self] * (len(draft) + 1)
        self._wait()
        twin, guard = self.matcher.deep_copy(), self.guard and self.guard.fork()
        rows = [_Fixed(self.bitmask.clone())]
        for j, token in enumerate(draft, 1):
            # stopped: the token before ended the reply (an end token then, as llguidance
            # accepts one, is not consumed), so no row after it is ever kept
            if twin.is_stopped() or not twin.consume_token(token):
                break
            bitmask = torch.empty_like(self.bitmask)
            _next_mask(twin, guard, (token,), None if self._left is None else self._left - j, bitmask)
            rows.append(_Fixed(bitmask))
        return rows + rows[-1:] * (len(draft) + 1 - len(rows))

    def _wakes_at(self, draft: list[int]) -> int:
        """Asleep: the index of the first draft token that would wake the grammar, else k."""
        trigger, seen = self.trigger, bytes(self._seen)
        for j, token in enumerate(draft):
            if trigger.token_ids:
                if token in trigger.token_ids:
                    return j
                continue
            seen += self.ll.decode_bytes([token])
            if trigger.text in seen:
                return j
        return len(draft)

    def log_fields(self) -> list[str]:
        """For the request's log line: masks applied, how many were ready, mean ms."""
        mean = self.total_mask_ms / self.num_masks if self.num_masks else 0.0
        closing = self.guard is not None and self.guard.is_closing
        return [f"grammar_masks={self.num_masks}", f"grammar_ready={self.num_ready}",
                f"grammar_mask_ms={mean:.2f}"] + (["grammar_failed=1"] if self.is_failed else []) \
            + ([f"grammar_{self.guard.why}_closed={self.guard.num_narrowed}"] if closing else [])

    def _watch(self, token_id: int):
        trigger = self.trigger
        if trigger.token_ids:
            if token_id in trigger.token_ids:
                self._wake([token_id])
            return
        self._seen += self.ll.decode_bytes([token_id])
        at = self._seen.find(trigger.text)
        if at >= 0:
            self._wake(self.ll.tokenize_bytes(bytes(self._seen[at:])))
        else:
            del self._seen[:max(0, len(self._seen) - len(trigger.text))]

    def _wake(self, tokens: list[int]):
        self.is_active = True
        if not self.matcher.consume_tokens(tokens):
            return self._fail(f"the opener was not the grammar's: {self.matcher.get_error()}")
        self._compute_next(tokens)

    def _fail(self, why: str):
        self.is_failed = True
        self.log(f"kimi-engine: grammar stops constraining this request: {why}")

    def _compute_next(self, consumed=()):
        self._pending = worker().submit(self._fill, consumed, self._left)

    def _fill(self, consumed=(), left: int | None = None):
        """On the grammar thread: the loop guard reads the tokens just consumed (off the
        model thread) and the budget left, then the next mask is computed."""
        self.mask_ms = _next_mask(self.matcher, self.guard, consumed, left, self.bitmask)

    def _wait(self):
        if self._pending is not None:
            self._pending.result()
            self._pending = None


def _next_mask(matcher, guard: LoopGuard | None, consumed, left: int | None,
               bitmask: torch.Tensor) -> float:
    """The guard reads the tokens just consumed and the budget left; then matcher's next mask
    goes into bitmask [1, W], narrowed by the guard. -> ms the mask took (the reading not)."""
    if guard is not None:
        for token in consumed:
            guard.push(token)
        if left is not None:
            guard.left(left)
    started = time.perf_counter()
    matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * bitmask.element_size())
    if guard is not None:
        guard.narrow(bitmask, matcher)
    return (time.perf_counter() - started) * 1e3


@dataclass
class _Fixed:
    """One verify row's mask, computed ahead (GrammarMatcher.draft_rows)."""
    bitmask: torch.Tensor
    is_masking: bool = True
    is_failed: bool = False

    def mask(self) -> tuple[torch.Tensor, None, None]:
        """None, None: computed with the draft, not on the grammar thread: not timed."""
        return self.bitmask, None, None


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack(bitmask: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """bitmask: [R, W] int32 (bit j of word w allows token 32w+j) -> allowed [R, vocab] bool
    on `device`; ids past 32W (a model's padded vocabulary) are never allowed. On the CPU by
    numpy, single-threaded: a parallel torch op on a busy host can wait milliseconds for its
    second thread, longer than the work."""
    if device.type == "cpu":
        import numpy as np
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
        allowed = torch.from_numpy(bits[:, :vocab].astype(bool))        # [R, min(32W, vocab)]
    else:
        shifts = _SHIFTS.get(device)
        if shifts is None:
            shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
        words = bitmask.to(device, non_blocking=True)
        allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]  # [R, 32W]
    if allowed.shape[1] == vocab:
        return allowed
    pad = torch.zeros(allowed.shape[0], vocab - allowed.shape[1], dtype=torch.bool, device=device)
    return torch.cat([allowed, pad], dim=1)


def masked(rows: torch.Tensor, grammars: list, observe=lambda ms, is_ready: None,
           greedy: list[bool] | None = None) -> torch.Tensor:
    """rows: [R, V] logits; grammars[r]: a GrammarMatcher or None -> rows with every token
    a masking grammar forbids at -inf (a new tensor; `rows` itself is left alone).
    greedy[r]: row r only takes its argmax. On the CPU such a row whose raw argmax the
    grammar allows is left unmasked: its masked argmax is that same token (the first of the
    maxima either way), and the masking costs a tenth of a token's decode."""
    index = [r for r, g in enumerate(grammars) if g is not None and g.is_masking]
    if not index:
        return rows
    masks = []
    for r in index:
        bitmask, ms, is_ready = grammars[r].mask()
        if ms is not None:  # a draft's rows were made ahead: they do not count as timed
            observe(ms, is_ready)
        masks.append(bitmask)
    kept = [k for k, r in enumerate(index) if not grammars[r].is_failed]
    # a grammar that failed now draws freely (logged), never from an empty mask
    if greedy is not None and rows.device.type == "cpu":
        best = rows.numpy().argmax(-1).tolist()  # numpy's: a tenth of torch's time
        kept = [k for k in kept if not (greedy[index[k]] and _allows(masks[k], best[index[k]]))]
    if len(kept) < len(index):
        index, masks = [index[k] for k in kept], [masks[k] for k in kept]
        if not index:
            return rows
    allowed = unpack(torch.cat(masks), rows.shape[1], rows.device)  # [R', V]
    if rows.device.type == "cpu":  # numpy again: no torch thread pool for 200 KB
        import numpy as np
        out = rows.numpy().copy()
        # fmin(logit, +inf or -inf), the bound looked up by the bit: no branch per token (a
        # boolean assignment or np.where mispredicts on a mixed mask: 125 us against 35 us)
        bounds = np.take(np.array([-np.inf, np.inf], np.float32), allowed.numpy().view(np.uint8))
        out[index] = np.fmin(out[index], bounds)  # fmin: a forbidden NaN logit is -inf too
        return torch.from_numpy(out)
    out = rows.clone()
    picked = torch.tensor(index, device=rows.device)
    out[picked] = rows[picked].masked_fill(~allowed, float("-inf"))
    return out


def _allows(bitmask: torch.Tensor, token: int) -> bool:
    """bitmask [1, W]: whether it allows token (ids past 32W never)."""
    word = token >> 5
    return word < bitmask.shape[1] and bool(int(bitmask[0, word]) >> (token & 31) & 1)
