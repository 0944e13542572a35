"""Concurrent Kimi-Linear streams on the CPU, served: aggregate decode of `synthetic:small`
(8 layers, hidden 256, 32 experts top-4, INT4 experts, random weights) over the socket.

    .venv/bin/python bench/kimi_streams.py [--runs 5] [--model synthetic:small]

For 1, 2, 4 and 8 concurrent greedy streams (64 tokens each, ignore_eos): aggregate tok/s =
tokens after each stream's first / (last token of any - first token of any), the median of
`--runs` runs, beside one stream. Tokens are counted from vLLM's `token_ids` (random weights
emit byte tokens that are not always whole characters). Each stream's ids are also compared
with the same prompt run alone. Goal (issue 15): 4 streams >= 2.5x one stream.
"""
import argparse
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from agent_turns import Daemon  # noqa: E402
from common import concurrent_chunks, record, token_chunks  # noqa: E402

NEW_TOKENS, STREAMS = 64, (1, 2, 4, 8)


def stream_ids(chunks: list) -> tuple[float | None, float | None, list[int]]:
    """A stream's token_chunks -> (time of first ids, time of last, all ids)."""
    return (chunks[0][0] if chunks else None, chunks[-1][0] if chunks else None,
            [i for _, ids in chunks for i in ids])


def aggregate(sock: str, prompts: list[str],
              max_tokens: int = NEW_TOKENS) -> tuple[float, list[list[int]]]:
    rows = [stream_ids(chunks) for chunks in concurrent_chunks(sock, prompts, max_tokens)]
    tokens = sum(len(ids) - 1 for _, _, ids in rows)
    span = max(r[1] for r in rows) - min(r[0] for r in rows)  # 0: every id came in one chunk
    return tokens / span if span > 0 else float("nan"), [r[2] for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", default="synthetic:small")
    parser.add_argument("--threads", type=int, default=2, help="the engine's --threads (default 2)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    prompts = [f"Stream {i}: the quick brown fox number {i} jumps." for i in range(max(STREAMS))]
    daemon = Daemon("--model", args.model, "--max-context", "2048", "--max-batch", "8",
                    "--threads", str(args.threads))
    try:
        alone = [stream_ids(token_chunks(daemon.sock, p, NEW_TOKENS, i))
                 for i, p in enumerate(prompts)]
        rates, mismatches = {}, 0
        for n in STREAMS:
            runs = []
            for _ in range(args.runs):
                rate, ids = aggregate(daemon.sock, prompts[:n])
                runs.append(rate)
                mismatches += sum(ids[i] != alone[i][2] for i in range(n))
            rates[n] = statistics.median(runs)
    finally:
        daemon.stop()
    load = os.getloadavg()
    lines = ["| streams | aggregate decode tok/s | vs 1 stream |", "|---:|---:|---:|"]
    lines += [f"| {n} | {rate:.1f} | {rate / rates[1]:.2f}x |" for n, rate in rates.items()]
    lines += ["", f"{args.model}, medians of {args.runs} runs; streams whose ids differ from the "
                  f"same prompt alone: {mismatches}; load average {load[0]:.2f} {load[1]:.2f} "
                  f"{load[2]:.2f}. Goal at 4 streams: >= 2.5x one stream."]
    print("\n".join(lines))
    if not args.no_record:
        record("kimi_streams", {"model": args.model, "rates": rates, "mismatches": mismatches,
                                "load": load},
               f"Concurrent Kimi-Linear streams, {args.model}, CPU",
               f"python bench/kimi_streams.py --model {args.model} --runs {args.runs} "
               f"--threads {args.threads}", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
