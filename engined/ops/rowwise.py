"""Decode rows whose results do not depend on the batch they run in, on the CPU.

torch's CPU matmul and bmm choose their blocking by the number of rows, so a row's sums round
differently in a batch of three than alone (about 1e-7 relative: Kimi-Linear's logits moved by
1e-6); and its elementwise exp and sigmoid take a vector path for whole vectors of a tensor
and a scalar one for the rest, which differ in the last bit (the router's sigmoid over 8
experts: scalar for one row, vector for four). Two things need the lone result bit for bit: speculative decoding, which verifies a
sequence's drafts as extra rows of a decode step (models/protocol.py, verifies_drafts), and a
greedy answer that must not change with the requests decoded beside it. So on the CPU the few
torch products of a decode step run a row at a time: the call a lone step makes. The C
helper's kernels are row-exact already; on a GPU the Triton kernels give each row its own
programs, and the torch products there are left batched.
"""
from typing import Callable

import torch

from engined.ops import registry


def rowwise(fn: Callable, x: torch.Tensor, *rest):
    """fn(x, *rest), with x: [B, ...] -> [B, ...] (or a tuple of such). On the CPU with B > 1:
    fn on each row of x alone ([1, ...], the call a lone row makes), the results concatenated
    on dim 0."""
    if registry.runs_as(x.device.type) != "cpu" or x.shape[0] <= 1:  # the GPU step stays batched
        return fn(x, *rest)
    rows = [fn(x[b:b + 1], *rest) for b in range(x.shape[0])]
    if isinstance(rows[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*rows))
    return torch.cat(rows)


# The CPU variants of Kimi-Linear's decode ops whose rows are row-exact: the C helper's, the
# per-row ones, and the references made of row-wise ops (tests/ops/test_rowwise.py checks the
# others' rows against lone rows). A KIMI_KERNELS pin to another variant, or a CPU without the
# helper (engine/kernels.py then runs the references), makes rows_exact False.
ROW_EXACT = {"w4a16_gemv": {"cpu_c"}, "w4a16_tiles": {"cpu_c"}, "w4a16_swiglu": {"composed"},
             "moe_decode": {"composed"},
             "moe_grouped": {"cpu_c"}, "moe_grouped_w4a8": {"cpu_c"},
             "kda_decode": {"cpu_c", "cpu_rows"},
             "paged_mla_decode": {"cpu_rows"}, "mla_latent": {"reference"},
             "add_rmsnorm": {"reference"}}


def rows_exact(device: str = "cpu") -> bool:
    """Whether every op of ROW_EXACT runs a row-exact variant on `device` now."""
    return all(registry.resolve(op, device).name in names for op, names in ROW_EXACT.items())
