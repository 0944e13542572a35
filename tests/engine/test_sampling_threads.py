"""Drawing from a few rows of logits runs on one torch thread on the CPU (a sleeping second
OpenMP thread costs more to wake than the copy and argmax), scoring a prompt keeps them all,
and the count comes back after (engine/loop.py, ops/torch_threads.py)."""
import pytest
import torch

from engined.engine.loop import Engine
from engined.ops.torch_threads import one_torch_thread


def threads_inside(logits) -> int:
    with Engine._sampling_threads(logits):
        return torch.get_num_threads()


def test_a_decode_batch_samples_on_one_thread_and_the_count_comes_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert threads_inside([torch.zeros(1, 8), torch.zeros(8, 8)]) == 1
        assert threads_inside([torch.zeros(1, 8), torch.zeros(512, 8)]) == 2  # prompt logprobs
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), one_torch_thread():
            raise RuntimeError("a failed draw")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
