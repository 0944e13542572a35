"""torch's own CPU ops on one thread for a block: the small ops around the C kernels.

A decode step's torch ops are tiny ([B, D] norms, one query's attention, the sampler's copy
and argmax of one row of logits): a second OpenMP thread, asleep since the last large op,
costs more to wake than the op takes (copying 49,152 logits: 88 us with two threads, 29 us
with one, on the 2-core EPYC), and it fights the C helper's threads.
"""
import contextlib

import torch


@contextlib.contextmanager
def one_torch_thread():
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
