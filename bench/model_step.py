"""Model-level step timing for the default model (not a test): RSS after load, decode tok/s at
batch 1 (greedy, 17-token prompt), prefill tok/s for a 512-token prompt.

    .venv/bin/python bench/model_step.py [--kernel cpu_c|reference] [--embed-dtype float16]
                                         [--kv-dtype float16] [--threads 2]
    .venv/bin/python bench/model_step.py --count-kernels [--no-prefill]

--count-kernels: the kernels one Kimi-Linear decode step launches on a GPU, by layer and op,
counted on the CPU (bench/kernel_count.py); it ends with the lines `kernels per decode step: N`
and `kernels per prefill chunk per layer: N` (the widest layer, one 256-token chunk).

Run one configuration per process so RSS figures do not mix. On a shared 2-core box, set
OMP_WAIT_POLICY=PASSIVE: torch's spinning OpenMP team otherwise fights the C helper's
threads and other jobs, and medians swing 3-5x (best-of figures are reported too).
"""
import argparse
import json
import resource
import statistics
import time

import torch

from engined.weights import loader
from engined.ops import registry


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size in MiB."""
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * resource.getpagesize()
    return current / 2**20, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def decode_tok_s(model, prompt: torch.Tensor, new_tokens: int) -> float:
    cache = model.new_cache(len(prompt) + new_tokens)
    logits = model.forward(prompt, cache, 0)
    pos = len(prompt)
    begin = time.perf_counter()
    for _ in range(new_tokens):
        token = logits[0].argmax().view(1)
        logits = model.forward(token, cache, pos)
        pos += 1
    return new_tokens / (time.perf_counter() - begin)


def prefill_tok_s(model, prompt: torch.Tensor) -> float:
    cache = model.new_cache(len(prompt))
    begin = time.perf_counter()
    model.forward(prompt, cache, 0)
    return len(prompt) / (time.perf_counter() - begin)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default=None, help="w4a16_gemv variant (default: shipped)")
    parser.add_argument("--embed-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--kv-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-context", type=int, default=8192,
                        help="touch a full KV cache of this size at the end, for peak RSS")
    parser.add_argument("--count-kernels", action="store_true",
                        help="count the GPU kernels of a Kimi-Linear decode step (on the CPU)")
    parser.add_argument("--no-prefill", action="store_true",
                        help="with --count-kernels: skip the prefill chunk's count")
    args = parser.parse_args()
    if args.count_kernels:
        return count_kernels(not args.no_prefill)
    base = rss_mb()
    with registry.using("w4a16_gemv", args.kernel) if args.kernel else _nothing():
        lm = loader.load_model("default", threads=args.threads, progress=False,
                               embed_dtype=getattr(torch, args.embed_dtype),
                               kv_dtype=getattr(torch, args.kv_dtype))
        loaded = rss_mb()
        gen = torch.Generator().manual_seed(0)
        short = torch.randint(0, 49152, (17,), generator=gen)
        long = torch.randint(0, 49152, (512,), generator=gen)
        decode_tok_s(lm.model, short, 4)  # warm-up
        decode = [decode_tok_s(lm.model, short, args.new_tokens) for _ in range(args.repeats)]
        prefill = [prefill_tok_s(lm.model, long) for _ in range(args.repeats)]
        after_runs = rss_mb()
        lm.model.new_cache(args.max_context).data.zero_()  # every KV page resident
    result = {"kernel": registry.selected_name("w4a16_gemv", "cpu") if not args.kernel else args.kernel,
              "embed_dtype": args.embed_dtype, "kv_dtype": args.kv_dtype, "threads": args.threads,
              "decode_tok_s": round(statistics.median(decode), 2), "decode_tok_s_best": round(max(decode), 2),
              "prefill_tok_s": round(statistics.median(prefill), 1), "prefill_tok_s_best": round(max(prefill), 1),
              "rss_import_mb": round(base[0]), "rss_after_load_mb": round(loaded[0]),
              "rss_after_runs_mb": round(after_runs[0]),
              f"rss_peak_with_{args.max_context}_kv_mb": round(rss_mb()[1]),
              "weight_bytes": lm.model.weight_bytes}
    print(json.dumps(result))


def count_kernels(prefill: bool):
    import kernel_count  # sets TRITON_INTERPRET=1 unless already set: before triton loads

    model = kernel_count.build()
    decode = kernel_count.decode_step(model)
    chunk = kernel_count.prefill_chunk(model) if prefill else None
    print("\n".join(kernel_count.report(decode, chunk)))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
