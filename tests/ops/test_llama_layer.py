"""llama_decode_layer beyond equivalence: every SIMD level present, both thread counts, the
output written in place, and clear refusals of what the C call cannot take."""
import ctypes

import pytest
import torch

import engined._kimi_helper
from engined import helper
from engined.ops import registry
from engined.ops.llama_decode_layer import cpu_c, reference
from engined.ops.w4a16_gemv import cpu_c as w4a16_cpu_c
from tests.ops.layer_cases import LLAMA_LAYER
from tests.support.simd import gemv_level_or_skip, level_ids

LEVELS = helper.SIMD_LEVELS
CASE = LLAMA_LAYER[5]  # B = 3, one row past a key chunk, W4A8


def fresh(case=CASE):
    return case.make(torch.Generator().manual_seed(case.seed))


def run(variant, args, **kw):
    args = list(args)
    args[4] = [c.clone() for c in args[4]]
    return registry.variants("llama_decode_layer")[variant].fn(*args, **kw), args[4]


@pytest.fixture(params=sorted(LEVELS), ids=level_ids(LEVELS))
def level(request):
    """Each SIMD level this CPU has (attention's fp16 loads and the GEMVs; the others skip)."""
    try:
        used = gemv_level_or_skip(request.param)
        print(f"w4a8 kernel {helper.INT8_LEVELS[helper.w4a8_simd()]}")
        yield used
    finally:
        helper.gemv_simd(2)


@pytest.mark.parametrize("case", LLAMA_LAYER, ids=lambda c: c.id)
def test_every_level_matches_the_block(level, case):
    args = fresh(case)
    want, want_kv = run("reference", args)
    got, got_kv = run("cpu_c", args)
    torch.testing.assert_close(got, want, atol=case.atol, rtol=case.rtol)
    for mine, theirs, pos in zip(got_kv, want_kv, args[5]):
        others = torch.arange(mine.shape[1]) != pos
        assert torch.equal(mine[:, others], theirs[:, others])  # only the row's position written
        # k and v round to fp16 to nearest even, as torch's cast, from float32 sums taken in
        # another order: one that lands on an fp16 rounding boundary may take the neighbouring
        # half (1 of 128 values, once, under the AVX-512 cap), never more than that one step
        written, reference = mine[:, pos].float(), theirs[:, pos].float()
        step = torch.finfo(torch.float16).eps * reference.abs().clamp_min(2.0 ** -14)
        assert ((written - reference).abs() <= step).all(), (written - reference).abs().max()
        assert int((written != reference).sum()) <= max(1, written.numel() // 100)


class KhAttention(ctypes.Structure):
    """csrc/kimi_simd.h's KhAttention: the helper's attention alone, its kernels compared bit
    for bit (through the layer, o_proj's int8 rounding of its input could hide a last bit)."""
    _fields_ = [(name, ctypes.c_int64) for name in ("rows", "heads", "kv_heads", "head_dim",
                                                    "q_stride")] + \
               [(name, ctypes.c_void_p) for name in ("q", "k_cache", "v_cache", "positions", "out")]


def attention(q, cache, positions, kv_heads, threads=2, tasks=False):
    """Each row of q [B, heads, hd] over one fp16 cache [2, S, kv_heads, hd] (a verify step's
    rows of one sequence), or row r over cache[r] (a list: B sequences) -> [B, heads * hd], on
    the kernels attention_simd names; tasks: the number of tasks the call would run instead."""
    lib = ctypes.CDLL(engined._kimi_helper.__file__)  # the loaded helper: its caps hold
    rows, heads, hd = q.shape
    assert rows <= helper.MAX_ROWS  # the C job's per-row arrays hold no more
    caches = cache if isinstance(cache, list) else [cache] * rows
    keys = (ctypes.c_void_p * rows)(*[c[0].data_ptr() for c in caches])
    values = (ctypes.c_void_p * rows)(*[c[1].data_ptr() for c in caches])
    at = torch.tensor(positions, dtype=torch.int64)
    out = torch.empty(rows, heads * hd)
    lib.kh_attention_work_floats.restype = lib.kh_attention_tasks.restype = ctypes.c_int64
    work = torch.empty(int(lib.kh_attention_work_floats(rows, heads, hd)) + 16)
    a = KhAttention(rows, heads, kv_heads, hd, heads * hd, q.data_ptr(), ctypes.addressof(keys),
                    ctypes.addressof(values), at.data_ptr(), out.data_ptr())
    if tasks:
        return int(lib.kh_attention_tasks(ctypes.byref(a), threads))
    lib.kh_attention(ctypes.byref(a), ctypes.c_void_p(work.data_ptr()), threads)
    return out


@pytest.mark.parametrize("start,tasks", [(1000, 4), (60, 6), (250, 5), (4090, 32), (5000, 16)])
def test_a_verify_steps_rows_share_each_key_range_and_keep_their_lone_bits(start, tasks):
    """A verify step's 8 rows of one sequence (positions start..start+7, 9 heads of 3 KV heads)
    read each key range of the cache once on two threads: a task takes a range for its rows in
    turn (at 1000: 4 ranges, 4 tasks of all KV heads and 8 rows, where one row a task made 32),
    and each row's output is its own bits alone. About a multiple of 64 keys the rows form two
    groups (60: 4 + 4 rows, one range, a task per KV head; 250: 6 rows of one range + 2 of two;
    4090: 6 + 2 rows of 16 ranges, the most); 5000: 16 ranges of 8 rows, 16 tasks. Eight
    sequences, or sixteen threads, keep one row a task."""
    gen = torch.Generator().manual_seed(start)
    heads, kv_heads, hd, positions = 9, 3, 64, list(range(start, start + 8))
    cache = torch.randn((2, start + 8, kv_heads, hd), generator=gen).half()
    q = torch.randn((8, heads, hd), generator=gen)
    assert attention(q, cache, positions, kv_heads, tasks=True) == tasks
    if start == 1000:
        assert attention(q, cache, positions, kv_heads, threads=16, tasks=True) == 32
        assert attention(q, [cache.clone() for _ in positions], positions, kv_heads,
                         tasks=True) == 32
    assert_lone_bits(q, cache, positions, kv_heads)


def assert_lone_bits(q, cache, positions, kv_heads):
    for threads in (1, 2, 16):
        together = attention(q, cache, positions, kv_heads, threads)
        for r, pos in enumerate(positions):
            alone = attention(q[r:r + 1], cache, [pos], kv_heads, threads)
            assert torch.equal(together[r:r + 1], alone), (threads, pos)


def test_rows_of_one_cache_with_more_or_fewer_ranges_share_a_group():
    """Rows 200 and 500 keys deep (one range and two of 256 keys) are one group: 4 tasks of 2
    rows (one row a task made 10), where a row of one range skips the second range."""
    gen = torch.Generator().manual_seed(7)
    positions = [199, 499, 200, 498]
    cache = torch.randn((2, 500, 3, 64), generator=gen).half()
    q = torch.randn((4, 9, 64), generator=gen)
    assert attention(q, cache, positions, 3, tasks=True) == 4
    assert_lone_bits(q, cache, positions, 3)


@pytest.mark.parametrize("hd", [16, 32, 48, 64, 80, 112, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2), (10, 2)])
def test_avx512_attention_gives_the_avx2_bits_alone(hd, heads, kv_heads):
    """8 rows (KH_MAX_ROWS) at 0, 7-9 (the last 8 keys whole or not), 63 and 65 (about a chunk
    of 64), 300 and 1100 (ranges of keys); groups of 1, 3, 4 (3 + 1 heads), 5 (3 + 2); one or
    more passes of 64 elements."""
    gen = torch.Generator().manual_seed(hd * 100 + heads)
    positions = [0, 7, 8, 9, 63, 65, 300, 1100]
    cache = torch.randn((2, max(positions) + 1, kv_heads, hd), generator=gen).half()
    q = torch.randn((len(positions), heads, hd), generator=gen)
    try:
        gemv_level_or_skip(2)
        assert helper.attention_simd(hd) == 2
        wide = attention(q, cache, positions, kv_heads)
        gemv_level_or_skip(1)
        narrow = attention(q, cache, positions, kv_heads)
    finally:
        helper.gemv_simd(2)
    assert torch.equal(wide, narrow)
    assert wide.isfinite().all() and wide.abs().sum() > 0


TILED = [case for case in LLAMA_LAYER if "-w4a8-tiles" in case.id]


@pytest.mark.parametrize("case", TILED, ids=lambda c: c.id)
def test_avx512_attention_gives_the_avx2_bits(case):
    """The projections' integer dots give the same bits at every level, so the layer at the
    AVX-512 cap and at the AVX2 cap differ only in attention's kernels and merge and in the
    row-wise work (kimi_act.c: the norms, RoPE, the adds, SiLU): the same bits too. hd 16
    (RoPE's 8 pairs by the portable loop), 48 (16 in 512 bits, then 8), 32 and 64."""
    args = fresh(case)
    hd = args[1].head_dim
    try:
        gemv_level_or_skip(2)
        assert helper.attention_simd(hd) == 2
        wide, wide_kv = run("cpu_c", args)
        gemv_level_or_skip(1)
        assert helper.attention_simd(hd) == 1
        narrow, narrow_kv = run("cpu_c", args)
    finally:
        helper.gemv_simd(2)
    assert torch.equal(wide, narrow)
    assert all(torch.equal(a, b) for a, b in zip(wide_kv, narrow_kv))


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_do_not_change_the_result(threads):
    args = fresh()
    w4a16_cpu_c.set_num_threads(1)
    try:
        one, _ = run("cpu_c", args)
        w4a16_cpu_c.set_num_threads(threads)
        many, _ = run("cpu_c", args)
    finally:
        w4a16_cpu_c.set_num_threads(None)
    assert torch.equal(one, many)


def test_out_may_be_h():
    args = fresh()
    want, _ = run("cpu_c", args)
    h = args[0].clone()
    got, _ = run("cpu_c", [h, *args[1:]], out=h)
    assert got.data_ptr() == h.data_ptr() and torch.equal(h, want)


def test_only_the_rows_position_and_earlier_are_read():
    """Cache rows after each position hold 1e3 in the cases; NaN there changes nothing."""
    args = fresh()
    want, _ = run("cpu_c", args)
    for cache, pos in zip(args[4], args[5]):
        cache[:, pos + 1:] = float("nan")
    got, _ = run("cpu_c", args)
    assert torch.equal(got, want)


def bad(args, index, value):
    args = list(args)
    args[index] = value
    return args


@pytest.mark.parametrize("what,change", [
    ("position past the cache", lambda a: bad(a, 5, [a[4][0].shape[1], 0, 0])),
    ("negative position", lambda a: bad(a, 5, [-1, 0, 0])),
    ("fp32 cache", lambda a: bad(a, 4, [c.float() for c in a[4]])),
    ("cache of other heads", lambda a: bad(a, 4, [c[:, :, :1].contiguous() for c in a[4]])),
    ("caches and rows disagree", lambda a: bad(a, 4, a[4][:2])),
    ("cos of other rows", lambda a: bad(a, 2, a[2][:1])),
    ("h of another width", lambda a: bad(a, 0, a[0][:, :32])),
])
def test_bad_input_is_a_kernel_error(what, change):
    with pytest.raises(registry.KernelError, match="llama_decode_layer"):
        run("cpu_c", change(fresh()))


def test_more_than_max_rows_is_refused():
    args = fresh(LLAMA_LAYER[2])  # B = 8
    h = torch.cat([args[0], args[0][:1]])
    with pytest.raises(registry.KernelError, match="rows"):
        run("cpu_c", [h, args[1], torch.cat([args[2], args[2][:1]]),
                      torch.cat([args[3], args[3][:1]]), args[4] + args[4][:1], args[5] + [0]])


def test_shapes_the_c_call_cannot_take_are_refused_with_their_numbers():
    layer = fresh()[1]
    odd = reference.LlamaLayer(layer.attn_norm, layer.ffn_norm, layer.eps, layer.qkv, layer.o,
                               layer.gate_up, layer.down, 6, 1, 16, layer.gemv)  # q/k/v rows wrong
    with pytest.raises(registry.KernelError, match="6 heads, 1 KV heads"):
        cpu_c.c_layer(odd)
    with pytest.raises(registry.KernelError, match="gemv must be one of"):
        reference.LlamaLayer(layer.attn_norm, layer.ffn_norm, layer.eps, layer.qkv, layer.o,
                             layer.gate_up, layer.down, 6, 3, 16, "w4a16_gemm")
