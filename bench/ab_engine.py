"""A/B: served decode and prefill of this checkout against another git revision, same run.

    .venv/bin/python bench/ab_engine.py --base main~5 [--rounds 5]
    .venv/bin/python bench/ab_engine.py --base 36cd218 --model synthetic:small --prefill 2048


The base revision is checked out into a temporary git worktree and its C helper is built
from its own csrc/. Both engines serve --model (the default model unless given; a
synthetic:NAME model is prompted with fixed token ids inside its vocabulary) over
their own Unix socket, one at a time so they never share the cores, and the rounds
alternate A, B, A, B so that a noisy neighbour hits both alike. Each round: the decode
request of bench/decode.py (17-token prompt, 64 new tokens, greedy) and a --prefill-token
prefill (512 unless given; TTFT, the prefix cache off). Reported: the median per side and B/A, recorded in bench/results/ab_engine-*.json,
from which bench/RESULTS.md is regenerated.
"""
import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import record, stream_text_times  # noqa: E402
from decode import DECODE_PROMPT, NEW_TOKENS, PREFILL_PROMPT, prompt_tokens  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL_NAMES = {"default": "SmolLM2 default model"}
ENGINE_MAIN = "import sys; sys.path.insert(0, sys.argv.pop(1)); from engined.__main__ import main; main()"


def checkout(rev: str, into: pathlib.Path) -> pathlib.Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(into), rev],
                   check=True)
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from engined._helper_build "
                    "import ffibuilder; ffibuilder.compile(tmpdir='.')"], cwd=into, check=True,
                   stdout=subprocess.DEVNULL)  # the base's own C helper, from its own csrc/
    return into


class Engine:
    """kimi-engine from `tree`, serving the default model on a private socket."""

    def __init__(self, tree: pathlib.Path, workdir: pathlib.Path, model: str, prefill: int):
        self.tree, self.sock = tree, str(workdir / "engine.sock")
        self.model, self.prefill = model, prefill
        self.env = dict(os.environ, XDG_CACHE_HOME=str(workdir.parent / "cache"))
        self.proc = None

    def __enter__(self) -> "Engine":
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE_MAIN, str(self.tree), "serve", "--model", self.model,
             "--socket", self.sock, "--threads", "2", "--prefix-cache-bytes", "0",
             "--max-context", str(max(2048, self.prefill + 64))],
            cwd=self.tree, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"engine from {self.tree} did not start")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def measure(self, tokens: list[int]) -> tuple[float, float]:
        """-> (decode tok/s after the first token, prefill tok/s)."""
        stream_text_times(self.sock, tokens[:DECODE_PROMPT], 8)  # warm-up
        first, last, count = stream_text_times(self.sock, tokens[:DECODE_PROMPT], NEW_TOKENS)
        start = time.perf_counter()
        first_prefill, _, _ = stream_text_times(self.sock, tokens[:self.prefill], 1)
        return (count - 1) / (last - first), self.prefill / (first_prefill - start)


def model_tokens(model: str, count: int) -> list[int]:
    """`count` prompt ids: the default model's text (bench/decode.py's, repeated as needed),
    or for synthetic:NAME a fixed spread over its vocabulary (random weights read no text)."""
    if model.startswith("synthetic:"):
        from engined.weights import synthetic

        vocab = synthetic.config_of(model)["vocab_size"]
        return [(7919 * i + 11) % (vocab - 1) + 1 for i in range(count)]
    from engined.weights.default_model import default_gguf_path

    tokens = prompt_tokens(default_gguf_path())
    return (tokens * (count // len(tokens) + 1))[:max(count, len(tokens))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against (A)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="default", help="what both engines serve")
    parser.add_argument("--prefill", type=int, default=PREFILL_PROMPT, metavar="TOKENS",
                        help=f"the prefill prompt's length (default {PREFILL_PROMPT})")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    tokens = model_tokens(args.model, max(args.prefill, DECODE_PROMPT))
    work = pathlib.Path(tempfile.mkdtemp(prefix="kimi-ab-"))
    sides = {"A": checkout(args.base, work / "base"), "B": ROOT}
    runs = {"A": [], "B": []}
    try:
        for _ in range(args.rounds):
            for side, tree in sides.items():
                (work / side).mkdir(exist_ok=True)
                with Engine(tree, work / side, args.model, args.prefill) as engine:
                    runs[side].append(engine.measure(tokens))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "base")])
        shutil.rmtree(work, ignore_errors=True)
    med = {s: [statistics.median(r[i] for r in runs[s]) for i in (0, 1)] for s in runs}
    load = os.getloadavg()[0]
    rows = [f"| side | decode tok/s | {args.prefill}-token prefill tok/s |", "|---|---:|---:|",
            f"| A: {args.base} | {med['A'][0]:.1f} | {med['A'][1]:.0f} |",
            f"| B: working tree | {med['B'][0]:.1f} | {med['B'][1]:.0f} |",
            f"| B/A | {med['B'][0] / med['A'][0]:.3f} | {med['B'][1] / med['A'][1]:.3f} |",
            f"\nMedians of {args.rounds} alternating rounds; load average {load:.2f} at the end."]
    print("\n".join(rows))
    if not args.no_write:
        path = record("ab_engine", {"runs": runs, "median": med},
                      f"A/B served decode and prefill, {MODEL_NAMES.get(args.model, args.model)}, "
                      f"2 threads", f"bench/ab_engine.py --base {args.base} --rounds {args.rounds}"
                      f"{'' if args.model == 'default' else ' --model ' + args.model}"
                      f"{'' if args.prefill == PREFILL_PROMPT else f' --prefill {args.prefill}'}", rows)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
