"""What verifying drafts costs Kimi-Linear: one sequence's input token and k drafts as k + 1
rows of one decode step (models/kimi_linear.py), against a plain one-row step, on a
synthetic INT4 model. Drafts come from the model's own greedy output (every one accepted: the
sequence moves k + 1 positions a step) or are spoiled (every one rejected: it moves one, and
the next step resumes from the first row's state).

    .venv/bin/python bench/kimi_verify.py [--model small] [--device cpu] [--threads 2]
                                          [--steps 12] [--reps 5] [--record]

Rows: per k, the step's milliseconds (median of --reps runs of --steps steps), its ratio to
the one-row step measured in the same run, and tokens per second all accepted and all
rejected.

Rollback (issue 26 asks for both ways measured): the engine keeps each draft row's KDA state
in a slot of its own, so a rejection costs nothing after the step. The other way snapshots
the sequence's state before the step, runs the rows through one state, and on a rejection
restores the snapshot and runs the accepted rows again. Its cost, from measured parts (the
engine does not build it): the same k + 1-row step, less the k draft states it would not
write (each at most one snapshot's copy: a lower bound), plus the snapshot and its restore
(timed: save_state + load_state, every KDA layer), plus the recompute, a step of the accepted
rows (j + 1 rows for a first rejection at draft j: the all-rejected runs' one row here). The one-row step is eager decode_batch here; on a GPU, bench/gpu_quick.py prints
the graph-replayed step beside it (this file's `measure` runs there on its 48B model).
"""
import argparse
import statistics
import sys
import time

import torch

KS = (1, 2, 4, 8)
PROMPT = 256


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _greedy(model, prompt: torch.Tensor, steps: int) -> list[int]:
    """The model's plain greedy tokens after the prompt (the drafts that every verify accepts)."""
    cache = model.new_cache(len(prompt) + steps + 1)
    ids = [int(model.forward(prompt, cache, 0).argmax())]
    for i in range(steps):
        ids.append(int(model.decode_batch(torch.tensor([ids[-1]]), [cache], [len(prompt) + i]).argmax()))
    return ids


def _run(model, prompt, ids: list[int], k: int, steps: int, accepted: bool) -> float:
    """Seconds per step over `steps` steps of k + 1 rows (k = 0: plain steps)."""
    cache = model.new_cache(len(prompt) + steps * (k + 1) + k + 1)
    model.forward(prompt, cache, 0)
    at, vocab = len(prompt), model.config.vocab_size
    _sync(model.device)
    begin = time.perf_counter()
    for step in range(steps):
        n = at - len(prompt)
        drafts = ids[n + 1:n + 1 + k] if accepted else [(t + 1) % vocab for t in ids[n + 1:n + 1 + k]]
        model.decode_batch(torch.tensor([ids[n], *drafts]), [cache] * (k + 1),
                           list(range(at, at + k + 1)))
        at += k + 1 if accepted else 1
    _sync(model.device)
    return (time.perf_counter() - begin) / steps


def _snapshot_seconds(model, prompt, reps: int) -> float:
    """One sequence's KDA state saved and loaded back (the other rollback's fixed cost)."""
    cache = model.new_cache(len(prompt) + 1)
    model.forward(prompt, cache, 0)
    times = []
    for _ in range(max(reps, 5)):
        _sync(model.device)
        begin = time.perf_counter()
        cache.load_state(cache.save_state(), cache.num_tokens)
        _sync(model.device)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def measure(model, ks=KS, steps: int = 12, reps: int = 5, prompt_len: int = PROMPT) -> dict:
    """{"one_row_ms", "rows": [{k, ms_accepted, ms_rejected, ratio, tok_s_accepted,
    tok_s_rejected}]}: every k's medians, each rep running every configuration in turn."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g)
    ids = _greedy(model, prompt, steps * (max(ks) + 1) + max(ks) + 1)
    configs = [(0, True)] + [(k, ok) for k in ks for ok in (True, False)]
    times = {c: [] for c in configs}
    with torch.inference_mode():
        _run(model, prompt, ids, max(ks), 2, True)                     # warm-up
        for _ in range(reps):
            for k, ok in configs:
                times[(k, ok)].append(_run(model, prompt, ids, k, steps, ok))
    med = {c: statistics.median(t) for c, t in times.items()}
    one = med[(0, True)]
    return {"one_row_ms": 1e3 * one, "steps": steps, "reps": reps, "prompt": prompt_len,
            "snapshot_ms": 1e3 * _snapshot_seconds(model, prompt, reps), "rows": [
        {"k": k, "ms_accepted": 1e3 * med[(k, True)], "ms_rejected": 1e3 * med[(k, False)],
         "ratio": med[(k, True)] / one, "tok_s_accepted": (k + 1) / med[(k, True)],
         "tok_s_rejected": 1 / med[(k, False)]} for k in ks]}


def lines(result: dict, label: str) -> list[str]:
    one = result["one_row_ms"]
    out = [f"| {label} | step ms | ÷ one-row step | tok/s, all accepted | tok/s, all rejected |",
           "|---|---:|---:|---:|---:|",
           f"| one row (plain decode, baseline) | {one:.2f} | 1.00 | {1e3 / one:.1f} | {1e3 / one:.1f} |"]
    out += [f"| verify k = {r['k']} ({r['k'] + 1} rows) | {r['ms_accepted']:.2f} | {r['ratio']:.2f} | "
            f"{r['tok_s_accepted']:.1f} | {r['tok_s_rejected']:.1f} |" for r in result["rows"]]
    if "snapshot_ms" in result:
        snap = result["snapshot_ms"]
        out += ["", f"| rollback after every draft is rejected | per-row state slots (built), ms "
                    f"| snapshot + recompute, ms (at least) |", "|---|---:|---:|"]
        out += [f"| k = {r['k']} | {r['ms_rejected']:.2f} | "
                f"{r['ms_rejected'] - r['k'] * snap / 2 + snap + one:.2f} |" for r in result["rows"]]
        out.append(f"\nSnapshot and restore of one sequence's KDA state: {snap:.3f} ms; the "
                   "recompute of the one accepted row: the one-row step above.")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small", help="a synthetic config (engined/weights/synthetic.py)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--record", action="store_true", help="write bench/results/kimi_verify-DATE.json")
    args = ap.parse_args(argv)
    from engined.weights import synthetic
    model = synthetic.load(f"synthetic:{args.model}", args.device, threads=args.threads).model
    result = measure(model, steps=args.steps, reps=args.reps)
    table = lines(result, f"synthetic:{args.model}, {args.device}, {args.threads} threads")
    print("\n".join(table))
    if args.record:
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
        import common
        command = "bench/kimi_verify.py " + " ".join(argv if argv is not None else sys.argv[1:])
        notes = [f"", f"Prompt {result['prompt']} tokens; median of {args.reps} runs of "
                 f"{args.steps} steps each, every configuration in turn. Rows of one sequence "
                 "run in one decode_batch; each row's KDA state in a slot of its own."]
        print("wrote", common.record("kimi_verify", {"device": args.device, **result},
                                     "Kimi-Linear: verifying k drafts against one decode step",
                                     command, table + notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
