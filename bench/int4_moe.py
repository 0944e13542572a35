"""bench/int4_kernels.py's MoE rows: one Kimi-Linear MoE layer's routed experts through
moe_grouped (decode batches and a prefill chunk), and the decode step's whole MoE FFN through
moe_decode. Each takes `ik`, the running int4_kernels module: its helpers, and the DEVICE its
main set (run as a script it is __main__, not the module an import here would load again)."""
import statistics

import torch

from engined import ops  # noqa: F401  (registers every variant)
from engined.ops import int4_format, registry
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts
from engined.weights import kimi_checkpoint

MOE_EXPERTS, MOE_TOP_K, MOE_D, MOE_I = 256, 8, 2304, 1024
MOE_TOKENS = (1, 2, 4, 8, 256)  # decode batches, then a prefill chunk


def moe_inputs(ik, tokens: int, gen: torch.Generator, calls: int = 8) -> list[tuple]:
    """`calls` sets of a MoE layer's (x [T, D], experts [T, 8], weights [T, 8] fp32) on the bench's DEVICE,
    x in the dtype the model's hidden states have there (bf16 on CUDA): triton_dot takes its
    tensor-core product for bf16 and a CUDA-core fp32 one for fp32 x, which the model never
    runs."""
    out = []
    for _ in range(calls):
        picks = torch.stack([torch.randperm(MOE_EXPERTS, generator=gen)[:MOE_TOP_K]
                             for _ in range(tokens)]).to(ik.DEVICE)
        x = torch.randn(tokens, MOE_D, device=ik.DEVICE).to(kimi_checkpoint.act_dtype(ik.DEVICE))
        out.append((x, picks, torch.rand(tokens, MOE_TOP_K, device=ik.DEVICE)))
    return out


def expert_banks(ik) -> list:
    """One MoE layer's random symmetric INT4 banks on the bench's DEVICE: w1, w3 [E, I, D] and
    w2 [E, D, I] (0.9 GB: made once for both benches)."""
    return [PackedInt4Experts(group_size=ik.GROUP, **ik.random_packed(n, k, (MOE_EXPERTS,), True))
            for n, k in ((MOE_I, MOE_D), (MOE_I, MOE_D), (MOE_D, MOE_I))]


def bench_moe_layer(ik, args, banks: list | None = None) -> list[dict]:
    """One Kimi-Linear MoE layer's routed experts at real shapes (256 experts of w1/w3 [1024,
    2304] and w2 [2304, 1024], symmetric INT4, top-8) through moe_grouped and its W4A8 form
    moe_grouped_w4a8: T = 1 (8 experts, ~32 MB read, random picks per call so nothing stays
    cached), 2, 4 and 8 on the CPU (the decode batches: up to 64 experts, each read once for
    the rows that chose it) and a 256-token prefill chunk (every expert read once for all the rows
    that chose it). GB/s counts the chosen experts' bytes; tok/s: tokens per second through
    the layer."""
    probe = ik.probe_bandwidth(args.working_set, args.min_time)
    gen = torch.Generator().manual_seed(3)
    banks = banks or expert_banks(ik)
    # the CPU's tiles too (csrc/kimi_moe_tiles.c): 16 rows a vector instruction, W4A8 and W4A16
    layouts = {"": banks, " tiles": [b.to_tiles() for b in banks] if ik.DEVICE == "cpu" else None}
    expert_bytes = 3 * ik.packed_bytes(MOE_I, MOE_D, True)   # codes + one fp16 scale per 32
    rows = []
    for tokens in MOE_TOKENS if ik.DEVICE == "cpu" else (1, 256):   # the GPU section's time
        picked = moe_inputs(ik, tokens, gen)
        chosen = statistics.mean(len(torch.unique(p)) for _, p, _ in picked) * expert_bytes
        for op, layout in (("moe_grouped", ""), ("moe_grouped", " tiles"),
                           ("moe_grouped_w4a8", ""),
                           ("moe_grouped_w4a8", " tiles")):  # W4A8: x and h rounded to int8
            if layouts[layout] is None:
                continue
            calls = [(x, *layouts[layout], p, w) for x, p, w in picked]
            for name, variant in ik.measured_variants(op, args):
                if name == registry.REFERENCE or (layout and "cuda" in variant.devices):
                    continue
                shown = (("tiles " if layout else "") + name if op == "moe_grouped"
                         else f"w4a8{layout} {name}")       # the dense rows' names
                secs = ik.seconds_per_call(variant.fn, calls, args.min_time, f"MoE T={tokens} {shown}")
                r = ik.row(f"Kimi MoE layer, T={tokens}, top-8 of 256", op, shown, "sym", MOE_D,
                        MOE_I, int(chosen), secs, secs, probe)
                r["tok_s"] = tokens / secs
                rows.append(r)
    return rows


def bench_moe_decode(ik, args, banks: list | None = None) -> list[dict]:
    """The decode step's MoE FFN as the model runs it at T <= 16 (moe_decode: routing from the
    router's logits, the chosen experts, the shared expert and the weighted sum; two Triton
    launches on CUDA, the composed variant on the CPU), at T = 1 and 8, Kimi shapes. GB/s
    counts the experts the routing chose (distinct over the T rows) and the shared expert."""
    from engined.ops.moe_decode.reference import route

    probe = ik.probe_bandwidth(args.working_set, args.min_time)
    gen = torch.Generator().manual_seed(5)
    banks = banks or expert_banks(ik)
    shared = [int4_format.PackedInt4(group_size=ik.GROUP, **ik.random_packed(n, k, symmetric=True))
              for n, k in ((2 * MOE_I, MOE_D), (MOE_D, MOE_I))]
    bias = (torch.rand(MOE_EXPERTS, generator=gen) * 0.1).to(ik.DEVICE)
    expert_bytes = shared_bytes = 3 * ik.packed_bytes(MOE_I, MOE_D, True)  # [2I, D] + [D, I] alike
    rows = []
    for tokens in (1, 8):
        calls, chosen = [], []
        for x, _, _ in moe_inputs(ik, tokens, gen):
            logits = torch.randn(tokens, MOE_EXPERTS, generator=gen).to(ik.DEVICE)
            calls.append((x, logits, bias, MOE_TOP_K, True, 2.446, *banks, *shared))
            chosen.append(len(torch.unique(route(logits.float(), bias, MOE_TOP_K, True, 2.446)[0])))
        nbytes = int(statistics.mean(chosen) * expert_bytes + shared_bytes)
        for name, variant in ik.measured_variants("moe_decode", args):
            if name == registry.REFERENCE:
                continue
            secs = ik.seconds_per_call(variant.fn, calls, args.min_time, f"moe_decode T={tokens} {name}")
            r = ik.row(f"Kimi MoE decode step FFN, T={tokens}, top-8 of 256 + shared", "moe_decode",
                    name, "sym", MOE_D, MOE_I, nbytes, secs, secs, probe)
            r["tok_s"] = tokens / secs
            rows.append(r)
    return rows
