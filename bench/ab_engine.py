"""A/B: served decode and prefill of this checkout against another git revision, same run.

    .venv/bin/python bench/ab_engine.py --base main~5 [--rounds 5]

The base revision is checked out into a temporary git worktree and its C helper is built
from its own csrc/. Both engines serve the default model over
their own Unix socket, one at a time so they never share the cores, and the rounds
alternate A, B, A, B so that a noisy neighbour hits both alike. Each round: the decode
request of bench/decode.py (17-token prompt, 64 new tokens, greedy) and a 512-token
prefill. Reported: the median per side and B/A, recorded in bench/results/ab_engine-*.json,
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

    def __init__(self, tree: pathlib.Path, workdir: pathlib.Path):
        self.tree, self.sock = tree, str(workdir / "engine.sock")
        self.env = dict(os.environ, XDG_CACHE_HOME=str(workdir.parent / "cache"))
        self.proc = None

    def __enter__(self) -> "Engine":
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE_MAIN, str(self.tree), "serve", "--model", "default",
             "--socket", self.sock, "--threads", "2", "--prefix-cache-bytes", "0"],
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
        first_prefill, _, _ = stream_text_times(self.sock, tokens[:PREFILL_PROMPT], 1)
        return (count - 1) / (last - first), PREFILL_PROMPT / (first_prefill - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against (A)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    from engined.weights.default_model import default_gguf_path

    tokens = prompt_tokens(default_gguf_path())
    work = pathlib.Path(tempfile.mkdtemp(prefix="kimi-ab-"))
    sides = {"A": checkout(args.base, work / "base"), "B": ROOT}
    runs = {"A": [], "B": []}
    try:
        for _ in range(args.rounds):
            for side, tree in sides.items():
                (work / side).mkdir(exist_ok=True)
                with Engine(tree, work / side) as engine:
                    runs[side].append(engine.measure(tokens))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "base")])
        shutil.rmtree(work, ignore_errors=True)
    med = {s: [statistics.median(r[i] for r in runs[s]) for i in (0, 1)] for s in runs}
    load = os.getloadavg()[0]
    rows = ["| side | decode tok/s | prefill tok/s |", "|---|---:|---:|",
            f"| A: {args.base} | {med['A'][0]:.1f} | {med['A'][1]:.0f} |",
            f"| B: working tree | {med['B'][0]:.1f} | {med['B'][1]:.0f} |",
            f"| B/A | {med['B'][0] / med['A'][0]:.3f} | {med['B'][1] / med['A'][1]:.3f} |",
            f"\nMedians of {args.rounds} alternating rounds; load average {load:.2f} at the end."]
    print("\n".join(rows))
    if not args.no_write:
        path = record("ab_engine", {"runs": runs, "median": med},
                      "A/B served decode and prefill, SmolLM2 default model, 2 threads",
                      f"bench/ab_engine.py --base {args.base} --rounds {args.rounds}", rows)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
