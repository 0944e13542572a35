"""The GPU graph tests' common part: a Runner captured over caches made before capture (as
the engine reserves them), the same prompts prefilled into a graphed and an eager set of
caches, then decode steps where the runner's tokens must be the eager decode_batch's.
The prompts prefill through KDA's reference (PREFILL): CUDA's default, fla-core's chunk_kda,
autotunes on its first call, a minute of compiles at the start of a timed step, and the
prefill section's tests are fla's; no decode step calls it."""
from dataclasses import dataclass

import torch

from engined.ops import registry

PROMPTS = ([3, 5, 7], [11, 2], [9, 9, 9, 4])
PREFILL = ("kda_prefill", "reference")


@dataclass
class Prefilled:
    runner: object
    lines: list
    metrics: object
    tokens: list
    graphed: list
    eager: list
    positions: list


def prefilled(model, max_batch: int = 4) -> Prefilled:
    """Call under torch.inference_mode(). The runner captures before any prefill."""
    from engined.commands import bench as synthetic_bench
    from engined.engine.runner import Runner
    lines, metrics = [], synthetic_bench.runner_metrics()
    graphed, eager = ([model.new_cache(32) for _ in PROMPTS] for _ in range(2))
    runner = Runner(model, metrics, lines.append, max_batch=max_batch, max_context=256)
    runner.capture()
    with registry.using(*PREFILL):
        tokens = [int(model.forward(torch.tensor(p, device=model.device), c, 0).argmax())
                  for p, c in zip(PROMPTS, graphed)]
        for p, c in zip(PROMPTS, eager):
            model.forward(torch.tensor(p, device=model.device), c, 0)
    return Prefilled(runner, lines, metrics, tokens, graphed, eager, [len(p) for p in PROMPTS])


def step_like_eager(p: Prefilled, model, steps: int = 4):
    """steps decode steps of every sequence: the runner's tokens are the eager step's."""
    for _ in range(steps):
        got = p.runner.decode(p.tokens, p.graphed, p.positions).argmax(-1).tolist()
        want = model.decode_batch(torch.tensor(p.tokens, device=model.device), p.eager,
                                  p.positions).argmax(-1).tolist()
        assert got == want
        p.tokens, p.positions = got, [q + 1 for q in p.positions]
