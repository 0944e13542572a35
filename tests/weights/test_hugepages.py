"""The CPU weights in 2 MiB pages (engined/weights/hugepages.py): gather_ moves tensors into
one mapping advised MADV_HUGEPAGE without changing a value, and the default model's
projections and head are read from huge pages where the kernel lends them."""
import mmap
import pathlib

import pytest
import torch

from engined.weights import hugepages, loader


def kernel_lends_huge_pages() -> bool:
    """A probe of its own (not gather_'s code): 8 MiB mapped, advised, touched; whether its
    mapping then shows AnonHugePages (THP off, a per-size or per-process setting, or memory
    too fragmented to give one: no)."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not pathlib.Path("/proc/self/smaps").exists():
        return False
    probe = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        probe.madvise(mmap.MADV_HUGEPAGE)
        probe.write(b"\1" * (8 << 20))
        view = memoryview(probe)
        address = torch.frombuffer(view, dtype=torch.uint8).data_ptr()
        return hugepages.smaps_huge_bytes(address) > 0
    except OSError:
        return False


LENT = kernel_lends_huge_pages()
needs_thp = pytest.mark.skipif(
    not LENT, reason=f"the kernel lent no huge pages to an advised 8 MiB probe (THP mode "
                     f"{hugepages.thp_mode() or 'none'!r}, or memory too fragmented)")
needs_madvise = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"),
                                   reason="this platform's mmap has no MADV_HUGEPAGE")


@needs_madvise
def test_gathered_tensors_keep_their_values_in_one_aligned_arena(monkeypatch):
    monkeypatch.setattr(hugepages, "available", lambda: True)  # the move itself, any kernel
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 256, (300, 7), dtype=torch.uint8, generator=gen)
    scales = torch.rand(300, 3, generator=gen).half()
    with torch.inference_mode():  # weights loaded there move too
        made_there = torch.randn(5, 9, generator=gen)
    wide = torch.randn(4, 6, generator=gen)
    strided = wide[:, ::2]                                   # not contiguous: left alone
    rows = wide[1:3]                                         # a view: left with its base
    tensors = [codes, None, scales, codes, made_there, strided, rows]
    want = [t.clone() for t in (codes, scales, made_there, strided)]
    strided_at, rows_at = strided.data_ptr(), rows.data_ptr()
    arena = hugepages.gather_(tensors)
    assert arena is not None and arena.start % hugepages.PAGE == 0
    got = (codes, scales, made_there, strided)
    for before, after in zip(want, got):
        assert torch.equal(before, after) and before.shape == after.shape
    moved = sorted((t.data_ptr(), t.numel() * t.element_size()) for t in got[:3])
    assert moved[0][0] == arena.start
    for (at, size), (next_at, _) in zip(moved, moved[1:]):
        assert at % hugepages.SLOT == 0 and at + size <= next_at     # aligned, apart
    assert moved[-1][0] + moved[-1][1] <= arena.start + arena.nbytes
    assert strided.data_ptr() == strided_at and rows.data_ptr() == rows_at
    del arena, tensors
    codes.add_(1)                          # the mapping lives as long as its tensors
    assert torch.equal(codes, want[0] + 1)


def test_a_mapping_the_kernel_refuses_leaves_the_weights_where_they_are(monkeypatch, caplog):
    monkeypatch.setattr(hugepages, "available", lambda: True)

    def refused(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(hugepages.mmap, "mmap", refused)
    t = torch.randn(64)
    at = t.data_ptr()
    assert hugepages.gather_([t]) is None and t.data_ptr() == at
    assert "weights stay in 4 KiB pages" in caplog.text


def test_nothing_moves_where_huge_pages_are_off(monkeypatch):
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "never")
    t = torch.randn(64)
    at = t.data_ptr()
    assert hugepages.gather_([t]) is None and t.data_ptr() == at


@needs_thp
def test_the_default_models_weights_are_read_from_huge_pages(monkeypatch):
    """Decode streams every projection and the head once a step: from 2 MiB pages, and with
    the same bits as from torch's own allocations."""
    model = loader.load_model("default", threads=1, progress=False).model
    arena = model.arena
    assert arena is not None and arena.huge_bytes() > 0
    held = [t for b in model.blocks
            for lin in (b.attn.qkv, b.attn.o, b.mlp.gate_up, b.mlp.gate_proj, b.mlp.up_proj,
                        b.mlp.down_proj)
            for t in (lin.packed.qweight, lin.packed.scales, lin.packed.mins) if t is not None]
    held += model.embedding.weight_tensors()
    outside = [t.shape for t in held
               if not arena.start <= t.data_ptr() < arena.start + arena.nbytes]
    assert not outside, f"weights left in their old memory: {outside[:4]}"  # views included
    assert hugepages.smaps_huge_bytes(held[0].data_ptr()) > 0
    monkeypatch.setattr(hugepages, "available", lambda: False)
    plain = loader.load_model("default", threads=1, progress=False).model
    assert plain.arena is None
    if hugepages.thp_mode() == "madvise":                  # torch's own pages are 4 KiB
        assert hugepages.smaps_huge_bytes(plain.blocks[0].attn.qkv.packed.qweight.data_ptr()) == 0
    prompt = torch.tensor([1, 9, 42, 7, 300])
    outs = []
    for m in (model, plain):
        cache = m.new_cache(16)
        m.forward(prompt, cache, 0)
        outs.append(m.decode_batch(torch.tensor([5, 6]), [cache, cache], [5, 6]))
    assert torch.equal(outs[0], outs[1])


def test_no_array_of_an_earlier_test_leaves_the_heap_advised_for_huge_pages():
    """numpy's own MADV_HUGEPAGE on large arrays is off in the test process (tests/conftest.py):
    with it on, a 30 MiB array carved from the heap and freed left that range advised, and a
    torch tensor placed there afterwards was backed by 2 MiB pages (seen in the suite, where
    the plain model's qkv of the test above showed 32 MiB of AnonHugePages)."""
    np = pytest.importorskip("numpy")
    assert np._core.multiarray._get_madvise_hugepage() is False


def test_a_weight_whose_scales_moved_gets_a_new_handle():
    """cpu_c's handle cache checked qweight's address alone: scales given new storage (as
    gather_ gives) kept a handle whose pointer named the freed memory."""
    from engined import helper
    from engined.ops import int4_format
    from engined.ops.w4a16_gemv import cpu_c

    if not helper.available():
        pytest.skip("no C helper built here")
    gen = torch.Generator().manual_seed(2)
    w = int4_format.PackedInt4(torch.randint(0, 256, (32, 32), dtype=torch.uint8, generator=gen),
                               (torch.rand(32, 2, generator=gen) * 0.1).half(), None, 32)
    first = cpu_c.c_weight(w)
    moved = w.scales.clone()
    w.scales.set_(moved.untyped_storage(), 0, w.scales.shape, w.scales.stride())
    again = cpu_c.c_weight(w)
    assert again is not first and again.address[1] == w.scales.data_ptr()
    assert first.address[1] != again.address[1]
