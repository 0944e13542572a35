"""Compile, for sm_90 and with no GPU, every Triton kernel the 48B's GPU path launches: the
decode graph step of each batch bucket (block tables of a short, a 32k and a 128k context) and
prefill chunks of 2048, 256 and 7 tokens (fla's chunk_kda with every autotune config, the W4A16
GEMM, the grouped MoE).
The model is synthetic:kimi-linear-48b on the meta device (real shapes, no memory), its CUDA
code path run through tests/support/sm90.py's stand-in. Prints one JSON object:

    {"triton": version, "hopper": fla's verdict, "phases": {phase: [[kernel, seconds, shared
     bytes, warps, autotuner call or 0], ...]}, "skipped": [config that failed to compile]}

    PYTHONPATH=.triton-gpu .venv/bin/python tests/support/gpu_step_compile.py   # the image's triton
"""
import json
import sys

import torch

from engined.config import DEFAULT_PREFILL_CHUNK
from tests.support import sm90

BUCKETS = (1, 2, 4, 8)
CONTEXTS = (64, 32768, 131072)  # short, 32k and the `long` section's 128k
# prefill chunks: the GPU's default, the CPU's (--prefill-chunk 256), and a prompt's short tail
PREFILL_TOKENS = (DEFAULT_PREFILL_CHUNK["cuda"], DEFAULT_PREFILL_CHUNK["cpu"], 7)


def build():
    from engined.models.kimi_linear import KimiLinearModel
    from engined.models.kimi_linear_config import parse_config
    from engined.weights import synthetic

    config = parse_config(synthetic.CONFIGS["kimi-linear-48b"])
    return KimiLinearModel(config, torch.bfloat16, "meta", synthetic.selective_int4(config),
                           torch.bfloat16)


@torch.inference_mode()
def main() -> int:
    sm90.install()
    import triton
    import fla.utils

    from engined.models.kimi_graph_step import KimiGraphStep
    from engined.models.latent_pool import num_blocks_for
    from engined.ops import registry

    model = build()
    phases: dict[str, list] = {}
    skipped: list[str] = []
    with registry.standing_in("meta", "cuda"):
        for rows in BUCKETS:
            for context in CONTEXTS:
                with sm90.compiling(phases.setdefault(f"decode B{rows} S{context}", []), skipped):
                    KimiGraphStep(model, rows, num_blocks_for(context)).run()
        for tokens in PREFILL_TOKENS:
            with sm90.compiling(phases.setdefault(f"prefill T{tokens}", []), skipped):
                cache = model.new_cache(tokens)
                model.forward(torch.arange(tokens, device="meta"), cache, 0)
    print(json.dumps({"triton": triton.__version__, "hopper": bool(fla.utils.is_nvidia_hopper),
                      "phases": {name: [[c.kernel, round(c.seconds, 3), c.shared, c.num_warps, c.tuning]
                                        for c in done] for name, done in phases.items()},
                      "skipped": skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
