"""A Kimi-Linear decode step's rows (models/kimi_linear.py's decode_batch): which rows are
one sequence's, and the device tensors a part of the step runs on, the KDA passes included
when a sequence has several rows (kimi_cache.StatePass)."""
import math

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
    slots = [c.draft_slot(j) for c, j in zip(caches, row_of)]
    width = max(len(c.blocks) for c in caches)
    tables = [c.blocks + c.blocks[:1] * (width - len(c.blocks)) for c in caches]
    parts = [slots, tables, positions]
    if any(row_of):
        for j in sorted(set(row_of)):
            rows = [b for b, jb in enumerate(row_of) if jb == j]
            parts += [rows, [slots[b] for b in rows], [caches[b].slots[j - 1] for b in rows] if j else None]
    values, shapes = flat_ints(parts)
    made = views(torch.tensor(values, dtype=torch.int64, device=device), shapes)
    passes = tuple(StatePass(*made[i:i + 3]) for i in range(3, len(made), 3)) or None
    return DecodeRows(*made[:3], passes=passes)


def flat_ints(parts: list) -> tuple[list[int], list]:
    """Lists of ints ([n]), lists of equal int lists ([n, m]) or None -> their values in
    one list and each part's shape (None stays None): a step's rows sent in one copy."""
    values, shapes = [], []
    for part in parts:
        if part is None:
            shapes.append(None)
        elif part and isinstance(part[0], list):
            shapes.append((len(part), len(part[0])))
            for row in part:
                values += row
        else:
            shapes.append((len(part),))
            values += part
    return values, shapes


def views(whole: torch.Tensor, shapes: list) -> list:
    """whole: [sum of the shapes' sizes] -> a view of it per shape, in order (None: None)."""
    made, at = [], 0
    for shape in shapes:
        size = 0 if shape is None else math.prod(shape)
        made.append(None if shape is None else whole[at:at + size].view(shape))
        at += size
    return made
