"""A Kimi-Linear decode step's rows (models/kimi_linear.py's decode_batch): which rows are
one sequence's, and the device tensors a part of the step runs on, the KDA passes included
when a sequence has several rows (kimi_cache.StatePass)."""
import torch

from engined.models.kimi_cache import DecodeRows, StatePass

STEP_ROWS = 8  # rows one decode_rows call runs: the GEMV's (helper.MAX_ROWS); more run in turn


def sequence_runs(caches: list, positions: list[int]) -> list[tuple]:
    """A step's rows -> (cache, first row, rows) per sequence, each sequence's rows consecutive
    and at consecutive positions (else ValueError)."""
    runs = []
    for b, (cache, pos) in enumerate(zip(caches, positions)):
        if runs and runs[-1][0] is cache and positions[b - 1] + 1 == pos:
            runs[-1][2] += 1
        else:
            runs.append([cache, b, 1])
    if len({id(cache) for cache, _, _ in runs}) != len(runs):
        raise ValueError("a sequence's rows in a decode step must be consecutive, at "
                         "consecutive positions")
    return [tuple(r) for r in runs]


def step_rows(caches: list, positions: list[int], row_of: list[int], device) -> DecodeRows:
    """Rows b with caches[b] at positions[b], each its sequence's row_of[b]-th of the step ->
    their slots (row j of a sequence in its j-th slot), block tables and positions; and when
    some row_of is not 0, the KDA passes, one per j in order."""
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
    slots = [c.draft_slot(j) for c, j in zip(caches, row_of)]
    width = max(len(c.blocks) for c in caches)
    tables = [c.blocks + c.blocks[:1] * (width - len(c.blocks)) for c in caches]
    passes = None
    if any(row_of):
        passes = tuple(StatePass(
            as_tensor(rows), as_tensor([slots[b] for b in rows]),
            as_tensor([caches[b].slots[j - 1] for b in rows]) if j else None)
            for j in sorted(set(row_of))
            for rows in [[b for b, jb in enumerate(row_of) if jb == j]])
    return DecodeRows(as_tensor(slots), as_tensor(tables), as_tensor(positions), passes=passes)
