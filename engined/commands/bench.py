"""Synthetic-weight decode benchmark for Kimi-Linear (`kimi-engine bench --synthetic ...`).

Builds the model with random weights directly on the device (no checkpoint), then measures
batch-1 greedy decode through the engine's own decode runner (engine/runner.py: a CUDA graph
per bucket on CUDA, the step the server runs, a token id back to the host per step as served):
a 17-token prompt, 64 new tokens, 5 repeats, median. The ceiling is the
bandwidth roofline: bytes read per decoded token (weights touched + KDA state read/write + MLA
latents) / the GPU's peak bandwidth (reference §7). Imports only torch and engined's model code,
so it runs on the GPU image (no cffi, flask or gevent):

    python -m engined.commands.bench --synthetic kimi-linear-48b --int4 --device cuda
"""
import argparse
import collections
import statistics
import time
from types import SimpleNamespace

import torch

from engined.engine import sampler
from engined.engine.runner import Runner
from engined.engine.sequence import SamplingParams
from engined.layers.moe import MoE
from engined.models.kimi_linear import KimiLinearModel
from engined.weights import synthetic as synthetic_weights

PROMPT_TOKENS, NEW_TOKENS, REPEATS = 17, 64, 5
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "L40S": 864e9, "5090": 1.79e12, "A100": 2.0e12,
                  "4090": 1.008e12, "A10G": 600e9, "L4": 300e9}
REFERENCE_BYTES = 2_464.7e6  # §7.2: local-kimi's selective INT4 (0.5625 B/param) weights + KDA state


def build(name: str, device: str, int4: bool, seed: int = 0) -> KimiLinearModel:
    return synthetic_weights.build(synthetic_weights.CONFIGS[name], device, int4, seed)


def bytes_per_token(model: KimiLinearModel, context: int) -> int:
    """Weights one decode step reads (k routed of E experts, one embedding row) + state traffic."""
    c, total = model.config, 0
    for layer in model.layers:
        total += sum(t.nbytes for t in synthetic_weights.layer_tensors(layer))
        if layer.is_mla:
            total += layer.self_attn.absorbed_bytes
        if isinstance(layer.ffn, MoE):
            moe = layer.ffn
            bank = moe.w1.nbytes + moe.w2.nbytes + moe.w3.nbytes
            total -= bank - bank * c.num_experts_per_token // c.num_experts
    total += model.norm.weight.nbytes + model.lm_head.nbytes + model.embed_tokens[0].nbytes
    return total + 2 * model.state_bytes + context * model.kv_bytes_per_token


GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0)


def decode_run(model: KimiLinearModel, runner: Runner, cache, prompt: torch.Tensor,
               new_tokens: int = NEW_TOKENS):
    """One greedy generation after the prompt, as the engine decodes -> (seconds per decoded
    token, tokens)."""
    cache.reset()
    token = int(model.forward(prompt, cache, 0).argmax(-1))
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    t0, tokens = time.perf_counter(), []
    for i in range(new_tokens):
        logits = runner.decode([token], [cache], [PROMPT_TOKENS + i])        # [1, V]
        token = sampler.sample_rows(logits, [GREEDY], [0], [i])[0]
        tokens.append(token)
    sync()
    return (time.perf_counter() - t0) / new_tokens, tokens


def eager_tokens(model: KimiLinearModel, prompt: torch.Tensor) -> list[int]:
    """Greedy tokens through the ordinary forward (the runner's cross-check)."""
    cache = model.new_cache(PROMPT_TOKENS + NEW_TOKENS + 1)
    token, out = model.forward(prompt, cache, 0).argmax(-1), []
    for i in range(NEW_TOKENS):
        token = model.forward(token, cache, PROMPT_TOKENS + i).argmax(-1)
        out.append(int(token))
    return out


class Tally:
    """A labelled counter as the runner calls it (prometheus_client's `labels(...).inc()`),
    counting into one Counter keyed by the label values: the runner's metrics outside the
    engine (the GPU image has no prometheus_client)."""

    def __init__(self, counts: collections.Counter | None = None, key: tuple = ()):
        self.counts, self.key = collections.Counter() if counts is None else counts, key

    def labels(self, *values) -> "Tally":
        return Tally(self.counts, values)

    def inc(self, amount: float = 1):
        self.counts[self.key] += amount


def runner_metrics() -> SimpleNamespace:
    """decode_steps counted by (mode, rows), graph_capture_failures by ()."""
    return SimpleNamespace(decode_steps=Tally(), graph_capture_failures=Tally())


def make_runner(model: KimiLinearModel, metrics=None) -> tuple[Runner, str]:
    """The engine's runner for one sequence: graphs on CUDA (a failed capture falls back to
    eager, and says so), eager elsewhere. Make the caches it will decode first: a cache made
    after capture can move the pools, and the runner then drops its graphs."""
    runner = Runner(model, metrics, print, max_batch=1, max_context=PROMPT_TOKENS + NEW_TOKENS + 1)
    runner.capture()
    return runner, mode_of(runner)


def mode_of(runner: Runner) -> str:
    return "CUDA graph" if runner.graphs else "eager"


def peak_bandwidth(device: str) -> tuple[str, float | None]:
    if torch.device(device).type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(torch.device(device))
    return name, next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)


def run(name: str, device: str, int4: bool, repeats: int = REPEATS) -> dict:
    model = build(name, device, int4)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (PROMPT_TOKENS,), generator=g).to(device)
    cache = model.new_cache(PROMPT_TOKENS + NEW_TOKENS + 1)
    runner, _ = make_runner(model)
    decode_run(model, runner, cache, prompt)                    # warm-up (allocator, kernels)
    runs = [decode_run(model, runner, cache, prompt) for _ in range(repeats)]
    mode = mode_of(runner)                                      # after the runs: graphs kept?
    secs = statistics.median(r[0] for r in runs)
    reference = eager_tokens(model, prompt)
    same = sum(a == b for a, b in zip(runs[0][1], reference))
    gpu, bw = peak_bandwidth(device)
    moved = bytes_per_token(model, PROMPT_TOKENS + NEW_TOKENS // 2)
    result = {"config": name, "device": gpu, "int4": int4, "tok_s": 1 / secs, "ms_per_token": 1e3 * secs,
              "mb_per_token": moved / 1e6, "weight_gb": model.weight_bytes / 1e9, "mode": mode,
              "same_as_eager": same}
    if bw:
        result.update(roofline_tok_s=bw / moved, pct_of_roofline=100 * (1 / secs) / (bw / moved),
                      reference_roofline_tok_s=bw / REFERENCE_BYTES)
    return result


def format_result(r: dict, repeats: int = REPEATS) -> str:
    line = (f"Kimi-Linear synthetic {r['config']} {'INT4' if r['int4'] else 'BF16'} on {r['device']}: "
            f"{r['tok_s']:.2f} tok/s ({r['ms_per_token']:.2f} ms/token), {r['mb_per_token']:.1f} MB read/token, "
            f"weights {r['weight_gb']:.2f} GB")
    if "roofline_tok_s" in r:
        line += (f"; roofline {r['roofline_tok_s']:.0f} tok/s -> {r['pct_of_roofline']:.1f}% "
                 f"(§7 reference roofline {r['reference_roofline_tok_s']:.0f} tok/s)")
    return line + (f"; batch 1, {PROMPT_TOKENS}-token prompt, {NEW_TOKENS} new, greedy, median of {repeats}, "
                   f"{r['mode']}; {r['same_as_eager']}/{NEW_TOKENS} tokens equal the eager forward's")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", default="kimi-linear-48b", choices=sorted(synthetic_weights.CONFIGS))
    ap.add_argument("--config", dest="synthetic", choices=sorted(synthetic_weights.CONFIGS), help="alias")
    ap.add_argument("--int4", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--record", metavar="RESULTS_MD", help="append the result line to this file")
    args = ap.parse_args(argv)
    with torch.inference_mode():
        line = format_result(run(args.synthetic, args.device, args.int4, args.repeats), args.repeats)
    print(line)
    if args.record:
        with open(args.record, "a") as f:
            f.write(f"- {time.strftime('%Y-%m-%d')} {line}\n")


if __name__ == "__main__":
    main()
