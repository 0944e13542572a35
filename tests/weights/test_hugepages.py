"""The CPU weights in 2 MiB pages (engined/weights/hugepages.py): gather_ moves tensors into
one mapping advised MADV_HUGEPAGE without changing a value, and the default model's
projections and head are read from huge pages where the kernel lends them."""
import pytest
import torch

from engined.weights import hugepages, loader

needs_thp = pytest.mark.skipif(
    not hugepages.available(),
    reason=f"transparent huge pages unavailable here (mode {hugepages.thp_mode() or 'none'!r})")


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
def test_an_arena_is_backed_by_huge_pages():
    tensors = [torch.randn(1 << 20) for _ in range(3)]      # 12 MiB
    arena = hugepages.gather_(tensors)
    assert arena.huge_bytes() >= 2 * hugepages.PAGE, "the advised arena got no huge pages"


@needs_thp
def test_the_default_models_weights_are_read_from_huge_pages(monkeypatch):
    """Decode streams every projection and the head once a step: from 2 MiB pages, and with
    the same bits as from torch's own allocations."""
    model = loader.load_model("default", threads=1, progress=False).model
    assert model.arena is not None
    blocks = model.blocks
    for t in (blocks[0].attn.qkv.packed.qweight, blocks[-1].mlp.down_proj.packed.qweight,
              model.embedding.weight_tensors()[0]):
        assert hugepages.smaps_huge_bytes(t.data_ptr()) > 0
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
