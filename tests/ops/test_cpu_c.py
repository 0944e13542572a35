"""cpu_c specifics beyond equivalence: threads, the portable kernel, input checks."""
import pytest
import torch

from engined import helper
from engined.ops import registry
from engined.ops.int4_format import PackedInt4
from engined.ops.w4a16_gemv import cpu_c, reference
from tests.ops.helpers import random_int4
from tests.support.simd import gemv_levels


level = gemv_levels()


@pytest.fixture
def weight():
    return PackedInt4(group_size=32, **random_int4(torch.Generator().manual_seed(0), 300, 576, 32))


@pytest.fixture(scope="module")
def big_weight():
    """n*k = 2**20: large enough that the C helper wakes its pool threads (KH_WAKE_WORTH)."""
    return PackedInt4(group_size=32, **random_int4(torch.Generator().manual_seed(9), 1024, 1024, 32))


@pytest.fixture
def threads():
    yield
    cpu_c.set_num_threads(None)


@pytest.mark.parametrize("size", ["small", "big"])
def test_thread_count_does_not_change_a_single_bit(weight, big_weight, threads, size):
    w = weight if size == "small" else big_weight
    x = torch.randn(3, w.shape[1])
    cpu_c.set_num_threads(1)
    one = cpu_c.w4a16_gemv(x, w)
    for n in (2, 3):
        cpu_c.set_num_threads(n)
        assert torch.equal(cpu_c.w4a16_gemv(x, w), one)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 8])
def test_every_kernel_level_matches_reference(weight, level, rows, symmetric):
    x = torch.randn(rows, 576)
    if symmetric:
        weight = PackedInt4(weight.qweight, weight.scales, None, weight.group_size)
    got = cpu_c.w4a16_gemv(x, weight)
    torch.testing.assert_close(got, reference.w4a16_gemv(x, weight), atol=1e-2, rtol=1e-4)


def test_bad_inputs_get_clear_errors(weight, threads):
    with pytest.raises(registry.KernelError, match=r"x must be \[M, 576\]"):
        cpu_c.w4a16_gemv(torch.randn(2, 575), weight)
    with pytest.raises(registry.KernelError, match="out must be"):
        cpu_c.w4a16_gemv(torch.randn(2, 576), weight, out=torch.empty(2, 300, dtype=torch.float64))
    strided = PackedInt4(weight.qweight.t().contiguous().t(), weight.scales, weight.mins, 32)
    with pytest.raises(registry.KernelError, match="contiguous"):
        cpu_c.w4a16_gemv(torch.randn(1, 576), strided)
    with pytest.raises(ValueError, match=">= 1"):
        cpu_c.set_num_threads(0)


def test_weight_pointers_are_dropped_with_the_weight():
    w = PackedInt4(group_size=32, **random_int4(torch.Generator().manual_seed(1), 8, 64, 32))
    cpu_c.w4a16_gemv(torch.randn(1, 64), w)
    key = id(w)
    assert key in cpu_c._cache
    del w
    assert key not in cpu_c._cache


@pytest.mark.parametrize("op", ["w4a16_grouped_gemv", "moe_swiglu"])
@pytest.mark.parametrize("variant", ["reference", "cpu_c"])
def test_routed_ops_refuse_bad_routes(op, variant):
    from tests.ops.helpers import experts
    gen = torch.Generator().manual_seed(2)
    stacks = [experts(gen, 5, 8, 64, 32) for _ in range(2 if op == "moe_swiglu" else 1)]
    fn = registry.variants(op)[variant].fn
    with pytest.raises(ValueError, match=r"expert ids must lie in 0\.\.4, got 1\.\.5"):
        fn(torch.randn(1, 64), *stacks, torch.tensor([1, 5]))
    with pytest.raises(ValueError, match=r"x must be \[1, 64\] or \[2, 64\]"):
        fn(torch.randn(3, 64), *stacks, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="non-empty 1-D integer"):
        fn(torch.randn(1, 64), *stacks, torch.tensor([], dtype=torch.int64))


def test_grouped_thread_count_does_not_change_a_single_bit(threads):
    from tests.ops.helpers import experts
    stack = experts(torch.Generator().manual_seed(3), 4, 96, 256, 32)
    x, ids = torch.randn(3, 256), torch.tensor([3, 0, 3])
    cpu_c.set_num_threads(1)
    one = registry.variants("w4a16_grouped_gemv")["cpu_c"].fn(x, stack, ids)
    cpu_c.set_num_threads(2)
    assert torch.equal(registry.variants("w4a16_grouped_gemv")["cpu_c"].fn(x, stack, ids), one)


def test_concurrent_callers_share_the_pool_safely(threads):
    """Python threads call in at once (the GIL is released in C), each job split over
    the pool: every result must equal its single-threaded answer bit for bit."""
    import concurrent.futures
    gen = torch.Generator().manual_seed(4)
    cases = []
    for n, k, m in ((257, 64, 1), (40, 96, 3), (1024, 1024, 2), (33, 160, 8), (2048, 512, 1)):
        w = PackedInt4(group_size=32, **random_int4(gen, n, k, 32))
        cases.append((torch.randn(m, k, generator=gen), w))
    cpu_c.set_num_threads(1)
    want = [cpu_c.w4a16_gemv(x, w) for x, w in cases]
    cpu_c.set_num_threads(3)

    def hammer(seed):
        for i in range(60):
            j = (seed + i) % len(cases)
            if not torch.equal(cpu_c.w4a16_gemv(*cases[j]), want[j]):
                return f"case {j} differs on call {i}"
        return None

    jobs_before, _ = helper.pool_stats()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(hammer, range(4))) == [None] * 4
    assert helper.pool_stats()[0] > jobs_before, "no call reached the worker pool"


def test_a_forked_child_can_still_multiply(big_weight, threads):
    """The pool's threads do not survive fork(); the child must start afresh, not hang."""
    import os
    cpu_c.set_num_threads(2)
    x = torch.randn(2, 1024)
    want = cpu_c.w4a16_gemv(x, big_weight)  # parent's helpers are running now
    pid = os.fork()
    if pid == 0:  # child: exit status says whether the answer matched
        ok = torch.equal(cpu_c.w4a16_gemv(x, big_weight), want)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_weight_given_new_storage_is_reread():
    gen = torch.Generator().manual_seed(5)
    w = PackedInt4(group_size=32, **random_int4(gen, 8, 64, 32))
    x = torch.randn(1, 64)
    cpu_c.w4a16_gemv(x, w)
    w.qweight.set_(torch.randint(0, 256, (8, 32), dtype=torch.uint8, generator=gen))
    torch.testing.assert_close(cpu_c.w4a16_gemv(x, w), reference.w4a16_gemv(x, w),
                               atol=1e-3, rtol=1e-4)
