"""How far drafting from the context can take the edit turns (bench/edit_turns.py's goal is
speculation on ÷ off >= 2.0x): the turns' plain greedy tokens, then offline, under the step
cost measured here, the shipped drafter (engined/engine/speculate.py: its lookup and its draft
length, step by step as the engine runs them) against oracles that know the tokens to come.

    .venv/bin/python bench/edit_turns_bound.py [--threads 2] [--max-tokens 160] [--context N]
                                               [--no-record]

An oracle drafts, each step, the longest run of the coming tokens that some earlier position
of the prompt or output continues with, among the positions whose preceding n tokens equal
the sequence's last n (n = 3: the shipped lookup's own candidates, n = 2, 1), and exactly as
many drafts as will stand: no drafter that looks things up in the context does better with
that n. The step cost is decode_batch of 1 to 8 rows of one sequence at ~250 positions
(median of 30 each, the row counts taken in turn 30 times), in process, as measured: on the
Intel CI kind 2 to 4 rows cost little more than one and 5 to 8 much more, and the engine's
draft length (StepCost) sees those costs too. With --context N the turns open with N tokens
of frozen agent context (bench/edit_turns.py's option) and the step cost is measured N + 250
positions deep: an agent's depth, where every verified row reads the whole cache; recorded
apart (edit_turns_bound_context).
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from edit_turns import frozen_turns  # noqa: E402

from engined.engine import speculate  # noqa: E402
from engined.engine.lookup import PromptLookup  # noqa: E402
from engined.engine.loop import PREFILL_CHUNK  # noqa: E402
from engined.weights import loader  # noqa: E402


def greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """Plain greedy decoding as the engine runs it: prefill chunks of PREFILL_CHUNK tokens,
    then one row a step."""
    cache = model.new_cache(len(prompt) + max_tokens)
    for first in range(0, len(prompt), PREFILL_CHUNK):
        logits = model.forward(torch.tensor(prompt[first:first + PREFILL_CHUNK]), cache, first)
    ids = [int(logits[-1].argmax())]
    while len(ids) < max_tokens:
        row = model.decode_batch(torch.tensor([ids[-1]]), [cache], [len(prompt) + len(ids) - 1])
        ids.append(int(row[0].argmax()))
    return ids


def step_cost(model, context: int = 250, reps: int = 30) -> tuple[float, ...]:
    """seconds[r] of a decode_batch of r = 1..K_MAX + 1 rows of one sequence (seconds[0]
    unused): the median of `reps`, the row counts interleaved so that a busy spell of the
    host falls on all of them."""
    counts = range(1, speculate.K_MAX + 2)
    caches = {}
    for rows in counts:
        caches[rows] = model.new_cache(context + rows + 1)
        model.forward(torch.arange(context) % 1000, caches[rows], 0)
    times = {rows: [] for rows in counts}
    for _ in range(reps):
        for rows in counts:
            begin = time.perf_counter()
            model.decode_batch(torch.arange(rows) + 5, [caches[rows]] * rows,
                               list(range(context, context + rows)))
            times[rows].append(time.perf_counter() - begin)
    return (0.0, *(statistics.median(times[rows]) for rows in counts))


def shipped(prompt: list[int], ref: list[int], cost: tuple[float, ...],
            engine: speculate.Acceptance) -> tuple[float, int, int, int]:
    """The engine's lookup and draft length on ref -> (seconds, steps, drafted, accepted);
    engine: the engine's acceptance counts, carried from turn to turn as a served engine's."""
    relative = tuple(t / cost[1] for t in cost)
    lookup, length = PromptLookup(prompt), speculate.DraftLength(engine)
    out, seconds, steps, drafted, accepted = [ref[0]], 0.0, 0, 0, 0
    while len(out) < len(ref):
        draft = lookup.draft(out, min(speculate.K_MAX, len(ref) - len(out) - 1))
        draft = draft[:length.choose(lookup.match, len(draft), relative)]
        stood = next((j for j, t in enumerate(draft) if ref[len(out) + j] != t), len(draft))
        if draft:
            length.verified(len(draft), stood)
        out += ref[len(out):len(out) + stood + 1]
        seconds += cost[1 + len(draft)]
        steps, drafted, accepted = steps + 1, drafted + len(draft), accepted + stood
    return seconds, steps, drafted, accepted


def oracle(prompt: list[int], ref: list[int], cost: tuple[float, ...], context: int,
           k_max: int = speculate.K_MAX) -> float:
    """Seconds with the oracle of the module's docstring (positions after `context` matching
    tokens)."""
    out, seconds = [ref[0]], 0.0
    while len(out) < len(ref):
        tokens, coming = prompt + out, ref[len(out):len(out) + k_max]
        end, best = len(prompt) + len(out), 0
        for p in range(context, end):
            if tokens[p - context:p] != tokens[end - context:]:
                continue
            n = 0
            while n < len(coming) and p + n < end and tokens[p + n] == coming[n]:
                n += 1
            best = max(best, n)
        out += ref[len(out):len(out) + best + 1]
        seconds += cost[1 + best]
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--context", type=int, default=0, metavar="N",
                    help="tokens of frozen agent context before each turn (default 0)")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args(argv)
    lm = loader.load_model("default", threads=args.threads, progress=False)
    frozen = frozen_turns(args.context)  # first: it refuses a --context it cannot give
    with torch.inference_mode():
        cost = step_cost(lm.model, args.context + 250)
        turns = [(t["kind"], lm.tokenizer.encode(lm.chat.render(t["messages"])), None)
                 for t in frozen]
        turns = [(kind, p, greedy(lm.model, p, args.max_tokens)) for kind, p, _ in turns]
    costs = ", ".join(f"{1e3 * t:.2f}" for t in cost[1:])
    lines = [f"Step cost, 1 to 8 rows, {args.context + 250} positions deep: {costs} ms.", "",
             "| turns | plain | shipped drafter | oracle, 3-token context | 2-token | 1-token |",
             "|---|---:|---:|---:|---:|---:|"]
    for kind in ("edit", "prose"):
        mine = [(p, ref) for k, p, ref in turns if k == kind]
        plain = sum(cost[1] * (len(ref) - 1) for _, ref in mine)
        engine = speculate.Acceptance(decay=speculate.ENGINE_DECAY)
        runs = [shipped(p, ref, cost, engine) for p, ref in mine]
        steps, drafted, accepted = (sum(r[i] for r in runs) for i in (1, 2, 3))
        bounds = [plain / sum(oracle(p, ref, cost, n) for p, ref in mine) for n in (3, 2, 1)]
        lines.append(f"| {kind} ({len(mine)}) | 1.00x | {plain / sum(r[0] for r in runs):.2f}x "
                     f"({accepted}/{drafted} accepted, {sum(len(r) - 1 for _, r in mine) / steps:.2f} "
                     f"tokens a step) | " + " | ".join(f"{b:.2f}x" for b in bounds) + " |")
    lines += ["", "Speedups over plain decoding of the same tokens under the step cost above "
              "(offline: no served run; bench/edit_turns.py measures the served one)."]
    print("\n".join(lines))
    if not args.no_record:
        import common
        depth = f", {args.context}-token context" if args.context else ""
        common.record("edit_turns_bound_context" if args.context else "edit_turns_bound",
                      {"step_s": list(cost[1:]), "context": args.context},
                      f"Edit turns{depth}: the shipped drafter against context-lookup oracles, "
                      f"SmolLM2-135M-Instruct, {args.threads} threads",
                      " ".join(["python bench/edit_turns_bound.py"] + sys.argv[1:]), lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
