"""The Triton variants at the full Kimi-Linear decode shapes, on a real GPU (gpu marker),
after the served decode step's CUDA graph (first: it decides the most).

Run on a GPU machine: `python -m pytest -q -m gpu tests/ops/test_gpu.py`. The 256-expert
banks are made once for the module (on the CPU, ~2 s each, they were most of its time).
"""
import functools

import pytest
import torch

from engined import ops  # noqa: F401  (registers every variant)
from engined.ops import registry
from engined.ops.int4_format import PackedInt4
from engined.ops.w4a16_grouped_gemv.experts import PackedInt4Experts
from tests.ops.decode_cases import kda_decode_case
from tests.ops.helpers import in_gpu_order, random_int4
from tests.support import graph_steps

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _cuda(t):
    return None if t is None else t.cuda()


@functools.cache
def _bank(n: int, k: int, symmetric: bool, index: int) -> PackedInt4Experts:
    """256 experts of [n, k], made once per module (index: a second bank of the same shape)."""
    gen = torch.Generator().manual_seed(n + k + index)
    return PackedInt4Experts(group_size=32, **random_int4(gen, n, k, 32, lead=(256,),
                                                         symmetric=symmetric))


@functools.cache
def _bank_on_gpu(n: int, k: int, symmetric: bool, index: int) -> PackedInt4Experts:
    s = _bank(n, k, symmetric, index)
    return PackedInt4Experts(s.qweight.cuda(), s.scales.cuda(), _cuda(s.mins), 32)


def test_the_served_decode_step_captures_and_replays_in_a_cuda_graph():
    """The engine's runner on a tiny synthetic Kimi-Linear: every bucket captures, replayed
    buckets give the eager tokens, and the graphs served every step. The caches are made
    before capture, as the engine reserves them: one made after could move the pools, and
    the runner would drop its graphs and decode eagerly."""
    from engined.commands import bench as synthetic_bench
    model = synthetic_bench.build("tiny", "cuda", int4=True)
    with torch.inference_mode():
        run = graph_steps.prefilled(model)
        runner, lines, metrics = run.runner, run.lines, run.metrics
        assert sorted(runner.graphs) == [1, 2, 4], lines
        graph_steps.step_like_eager(run, model)
        tokens, graphed, eager, positions = run.tokens, run.graphed, run.eager, run.positions
        got = runner.decode(tokens[:1], graphed[:1], positions[:1]).argmax(-1).tolist()
        assert got == model.decode_batch(torch.tensor(tokens[:1], device="cuda"), eager[:1],
                                         positions[:1]).argmax(-1).tolist()
    assert sorted(runner.graphs) == [1, 2, 4], lines          # no pool moved: graphs kept
    assert dict(metrics.decode_steps.counts) == {("graph", "4"): 4, ("graph", "1"): 1}, lines


def _close(got, want, k):
    torch.testing.assert_close(got.cpu(), want.cpu(), atol=2e-5 * k, rtol=1e-4)


@pytest.mark.parametrize("gpu_order", [False, True], ids=["disk-order", "gpu-order"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("n,k", [(4096, 2304), (2304, 4096), (1024, 2304)])
@pytest.mark.parametrize("m", [1, 8])
def test_dense_triton_at_kimi_shapes(n, k, m, symmetric, gpu_order):
    gen = torch.Generator().manual_seed(n + k + m)
    w = PackedInt4(group_size=32, **random_int4(gen, n, k, 32, symmetric=symmetric))
    x = torch.randn(m, k, generator=gen)
    want = registry.variants("w4a16_gemv")["reference"].fn(x, w)
    if gpu_order:                  # as a GPU holds them after load (to_gpu_order_)
        w = in_gpu_order(w)
    wd = PackedInt4(w.qweight.cuda(), w.scales.cuda(), _cuda(w.mins), 32, w.gpu_order)
    out = torch.full((m, n), float("nan"), device="cuda")
    got = registry.resolve("w4a16_gemv", "cuda").fn(x.cuda(), wd, out=out)
    _close(got, want, k)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("op,n,k,per_route", [("w4a16_grouped_gemv", 1024, 2304, False),
                                              ("w4a16_grouped_gemv", 2304, 1024, True),
                                              ("moe_swiglu", 1024, 2304, False)])
def test_routed_triton_256_experts_8_selected(op, n, k, per_route, symmetric):
    gen = torch.Generator().manual_seed(n + k)
    banks = [(n, k, symmetric, i) for i in range(2 if op == "moe_swiglu" else 1)]
    ids = torch.randperm(256, generator=gen)[:8]
    x = torch.randn(8 if per_route else 1, k, generator=gen)
    want = registry.variants(op)["reference"].fn(x, *(_bank(*b) for b in banks), ids)
    on_gpu = [_bank_on_gpu(*b) for b in banks]
    out = torch.full((8, n), float("nan"), device="cuda")
    got = registry.resolve(op, "cuda").fn(x.cuda(), *on_gpu, ids.cuda(), out=out)
    _close(got, want, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_mla_decode_at_kimi_shapes(dtype):
    """32 heads, R = 512, P = 64, blocks of 64, rows of 1 .. 3000 keys; a bf16 pool runs its
    products in bf16 (q and the probabilities rounded), so it gets a bf16-sized tolerance."""
    gen = torch.Generator().manual_seed(7)
    lengths = torch.tensor([1, 63, 64, 65, 3000, 700, 2, 129])
    need = (lengths + 63) // 64
    pool = torch.randn((int(need.sum()) + 3, 64, 576), generator=gen).to(dtype)
    tables = torch.zeros((8, int(need.max())), dtype=torch.int64)
    for b, ids in enumerate(torch.randperm(pool.shape[0], generator=gen)[:int(need.sum())].split(need.tolist())):
        tables[b, :len(ids)] = ids
    q_lat, q_rope = torch.randn((8, 32, 512), generator=gen), torch.randn((8, 32, 64), generator=gen)
    args = (q_lat, q_rope, pool, tables, lengths, 192 ** -0.5)
    want = registry.variants("paged_mla_decode")["reference"].fn(*args)
    out = torch.full((8, 32, 512), float("nan"), device="cuda")
    got = registry.resolve("paged_mla_decode", "cuda").fn(*(a.cuda() if isinstance(a, torch.Tensor) else a
                                                            for a in args), out=out)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.cpu(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_mla_decode_splits_a_32k_row_among_short_ones(dtype):
    """The split path at Kimi shapes: a 32k-key row (64 ranges of 512 keys) beside rows of 1 to
    300 keys, whose later ranges are empty. fp32 within 1e-4; bf16 (q and the probabilities
    rounded for the tensor cores) within 1% of each row's norm, which one missing range of
    the long row's exceeds."""
    gen = torch.Generator().manual_seed(11)
    lengths = torch.tensor([5, 32768, 1, 300])
    need = (lengths + 63) // 64
    pool = torch.randn((int(need.sum()) + 3, 64, 576), generator=gen).to(dtype)
    tables = torch.zeros((4, int(need.max())), dtype=torch.int64)
    for b, ids in enumerate(torch.randperm(pool.shape[0], generator=gen)[:int(need.sum())].split(need.tolist())):
        tables[b, :len(ids)] = ids
    q_lat, q_rope = torch.randn((4, 32, 512), generator=gen), torch.randn((4, 32, 64), generator=gen)
    args = (q_lat, q_rope, pool, tables, lengths, 192 ** -0.5)
    want = registry.variants("paged_mla_decode")["reference"].fn(*args)
    out = torch.full((4, 32, 512), float("nan"), device="cuda")
    got = registry.resolve("paged_mla_decode", "cuda").fn(*(a.cuda() if isinstance(a, torch.Tensor) else a
                                                            for a in args), out=out).cpu()
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    else:
        error = (got - want).flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1)
        assert (error < 1e-2).all(), error


def test_paged_mla_decode_graph_replay_at_32k_keys_within_6x_of_2k():
    """Batch 1 at Kimi shapes, bf16 pool: one CUDA graph captured over a 32k-token table (512
    blocks), replayed with the row at 2k and at 32k keys (its length is read on the device).
    16x the keys take less than 6x the time (one program per head block walking the whole
    row took ~16x), and the graph gives the eager output."""
    torch.manual_seed(5)
    pool = torch.randn((513, 64, 576), device="cuda").bfloat16()
    tables = torch.randperm(513, device="cuda")[:512][None].contiguous()
    lengths = torch.tensor([2048], device="cuda")
    q_lat, q_rope = torch.randn((1, 32, 512), device="cuda"), torch.randn((1, 32, 64), device="cuda")
    args = (q_lat, q_rope, pool, tables, lengths, 192 ** -0.5)
    decode = registry.resolve("paged_mla_decode", "cuda").fn
    decode(*args)                                             # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode(*args)
    ms = {}
    for n in (2048, 32768):
        lengths.fill_(n)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            graph.replay()
        end.record()
        end.synchronize()
        ms[n] = start.elapsed_time(end) / 50
    print(f"paged_mla_decode graph replay, batch 1: {ms}")
    torch.testing.assert_close(out, decode(*args), atol=0, rtol=0)
    assert ms[32768] < 6 * ms[2048], ms


@pytest.mark.parametrize("rows", [1, 8])
def test_mla_latent_at_kimi_shapes(rows):
    """R = 512, P = 64, blocks of 64, bf16 act, weight and pool; positions at block edges and
    the last of a 32k table. The rows and the whole pool as the reference's, within one bf16
    step (an fp32 rsqrt may round either way)."""
    gen = torch.Generator().manual_seed(rows)
    positions = torch.tensor([32767, 0, 63, 64, 1, 127, 2000, 4095][:rows])
    pool = torch.randn((rows + 2, 64, 576), generator=gen).bfloat16()
    tables = torch.randint(0, rows + 2, (rows, 512), generator=gen)
    tables[torch.arange(rows), positions // 64] = torch.randperm(rows + 2, generator=gen)[:rows]
    kv = (3 * torch.randn((rows, 576), generator=gen)).bfloat16()
    weight = (1 + 0.2 * torch.randn(512, generator=gen)).bfloat16()
    want_pool = pool.clone()
    want = registry.variants("mla_latent")["reference"].fn(kv, weight, 1e-6, want_pool, tables, positions)
    got_pool = pool.cuda()
    out = torch.full((rows, 576), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = registry.resolve("mla_latent", "cuda").fn(kv.cuda(), weight.cuda(), 1e-6, got_pool,
                                                    tables.cuda(), positions.cuda(), out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=1e-2, rtol=2 ** -7)
    torch.testing.assert_close(got_pool.cpu().float(), want_pool.float(), atol=1e-2, rtol=2 ** -7)


@pytest.mark.parametrize("tokens", [1, 8, 16])
def test_moe_grouped_at_kimi_shapes(tokens):
    """256 experts of w1/w3 [1024, 2304] and w2 [2304, 1024], 8 picks per token (symmetric)."""
    gen = torch.Generator().manual_seed(tokens)
    shapes = [(1024, 2304, True, 0), (1024, 2304, True, 1), (2304, 1024, True, 0)]
    banks = [_bank(*shape) for shape in shapes]
    ids = torch.stack([torch.randperm(256, generator=gen)[:8] for _ in range(tokens)])
    ids[1:, 0] = ids[0, 0]                                  # one expert shared by every token
    x, weights = torch.randn(tokens, 2304, generator=gen), torch.rand(tokens, 8, generator=gen)
    want = registry.variants("moe_grouped")["reference"].fn(x, *banks, ids, weights)
    on_gpu = [_bank_on_gpu(*shape) for shape in shapes]
    out = torch.full((tokens, 2304), float("nan"), device="cuda")
    got = registry.resolve("moe_grouped", "cuda").fn(x.cuda(), *on_gpu, ids.cuda(), weights.cuda(), out=out)
    torch.testing.assert_close(got.cpu(), want, atol=2e-5 * 3328 * 8, rtol=2e-4)


@pytest.mark.parametrize("rows", [1, 8])
def test_kda_step_at_kimi_shapes(rows):
    """32 heads of K = V = 128, states in slots of a 20-slot pool, updated in place."""
    gen = torch.Generator().manual_seed(rows)
    q, k = (torch.nn.functional.normalize(torch.randn(rows, 32, 128, generator=gen), dim=-1) for _ in range(2))
    g, v = -torch.rand(rows, 32, 128, generator=gen), torch.randn(rows, 32, 128, generator=gen)
    beta, states = torch.rand(rows, 32, generator=gen), torch.randn(20, 32, 128, 128, generator=gen) * 0.1
    slots = torch.randperm(20, generator=gen)[:rows]
    want_states = states.clone()
    want = registry.variants("kda_step")["reference"].fn(q, k, v, g, beta, want_states, slots, 128 ** -0.5)
    got_states = states.cuda()
    got = registry.resolve("kda_step", "cuda").fn(q.cuda(), k.cuda(), v.cuda(), g.cuda(), beta.cuda(),
                                                  got_states, slots.cuda(), 128 ** -0.5)
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_states.cpu(), want_states, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 8])
def test_kda_decode_at_kimi_shapes(rows, dtype):
    """32 heads of K = V = 128 (W = 4096), conv width 4, weights in the activations' dtype, fp32
    states; 20-slot pools of windows and states, updated in place by slot (unused ones compared
    too). The reference runs on the CPU; bf16 gets the case's bf16-sized tolerance."""
    case = kda_decode_case(rows, 32, 128, 4, 20, dtype, seed=rows)
    args = case.make(torch.Generator().manual_seed(case.seed))
    want_pools = [args[5].clone(), args[6].clone()]
    want = registry.variants("kda_decode")["reference"].fn(*args[:5], *want_pools, *args[7:])
    on_gpu = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    out = torch.full((rows, 4096), float("nan"), dtype=dtype, device="cuda")
    got = registry.resolve("kda_decode", "cuda").fn(*on_gpu, out=out)
    tol = 1e-4 if dtype == torch.float32 else case.atol
    for mine, theirs in zip((got, *on_gpu[5:7]), (want, *want_pools), strict=True):
        torch.testing.assert_close(mine.cpu(), theirs, atol=tol, rtol=tol)
