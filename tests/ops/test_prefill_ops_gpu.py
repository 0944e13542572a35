"""The prefill chunk's small Triton ops on a real GPU (gpu marker) at Kimi-Linear's shapes, bf16
activations: short_conv (3 x 4096 channels, 4 taps), gated_rmsnorm (32 heads of 128) and
moe_route (top-8 of 256). On the CPU the equivalence harness runs them interpreted, where the
programs run one after another: only a GPU runs short_conv's window reads and writes at once,
across its warps, behind the barrier between them."""
import pytest
import torch

from engined import ops  # noqa: F401  (registers every variant)
from engined.ops import registry
from tests.ops.prefill_cases import gated_rmsnorm_case, moe_route_case, short_conv_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def both(op: str, args: list, updated: int | None = None):
    """(reference on the CPU, the CUDA default on the GPU, into an out of NaNs: a store it
    skips shows) -> outputs and the updated argument."""
    mine = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    want = registry.variants(op)[registry.REFERENCE].fn(*mine)
    theirs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in args]
    out = torch.full(want.shape, float("nan"), dtype=want.dtype, device="cuda")
    got = registry.resolve(op, "cuda").fn(*theirs, out=out)
    assert got.data_ptr() == out.data_ptr()
    if updated is None:
        return want, got.cpu()
    return want, got.cpu(), mine[updated], theirs[updated].cpu()


@pytest.mark.parametrize("t,repeats", [(2048, 1), (7, 20), (2, 20)])
def test_short_conv_at_kimi_shapes(t, repeats):
    """Short chunks again and again, fresh windows each time: a race between the window's
    reads and its update (behind one barrier) would show now and then, not every time."""
    for seed in range(repeats):
        args = short_conv_case(t, 3 * 4096, 4, 3, torch.bfloat16, seed=seed).make(
            torch.Generator().manual_seed(t + seed))
        want, got, want_window, got_window = both("short_conv", args, updated=2)
        torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=2 ** -7)
        assert torch.equal(got_window, want_window)   # the window holds inputs: copies, exact


def test_gated_rmsnorm_at_kimi_shapes():
    args = gated_rmsnorm_case(2048, 32, 128, torch.bfloat16, seed=1).make(torch.Generator().manual_seed(1))
    want, got = both("gated_rmsnorm", args)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=2 ** -7)


def test_moe_route_at_kimi_shapes():
    """Each row's picks in order; a pick may differ where two biased scores are within an fp32
    step (the GPU's sigmoid and torch's may round apart): 1 row in 2048 at most."""
    args = moe_route_case(2048, 256, 8, True, seed=2).make(torch.Generator().manual_seed(2))
    want, got, want_experts, got_experts = both("moe_route", args, updated=5)
    same = (got_experts == want_experts).all(dim=1)
    assert int((~same).sum()) <= 1
    torch.testing.assert_close(got[same], want[same], atol=1e-6, rtol=1e-5)
