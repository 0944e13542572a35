"""The fp16 LM head through the C helper (gemv_f16): fp32-accurate dot products against a
float64 reference on awkward shapes, and each row's logits independent of the batch."""
import pytest
import torch

from engined import helper
from engined.layers.embedding import TiedEmbedding
from tests.support.simd import gemv_level_or_skip

pytestmark = pytest.mark.skipif(helper.lib is None, reason="C helper not built")


@pytest.fixture(params=[0, 1, 2], ids=["portable", "avx2", "avx512"])
def simd(request):
    """Each kernel level this CPU has (the head's AVX2 kernel serves machines without AVX-512)."""
    try:
        yield gemv_level_or_skip(request.param)
    finally:
        helper.gemv_simd(2)  # the shipped default: the best kernel the CPU has


@pytest.mark.parametrize("vocab,dim", [(1, 1), (5, 17), (37, 19), (1001, 576), (4099, 64)])
def test_c_head_matches_float64_and_rows_are_independent(simd, vocab, dim):
    gen = torch.Generator().manual_seed(vocab * 7 + dim)
    weight = torch.randn(vocab, dim, generator=gen).half()
    head = TiedEmbedding(weight)
    assert head.is_c_head
    x = torch.randn(9, dim, generator=gen)
    got = head.logits(x)  # [9, V]
    want = x.double() @ weight.double().t()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    for i in (0, 4, 8):
        assert torch.equal(head.logits(x[i:i + 1])[0], got[i])


def test_bad_shapes_are_einval():
    w = torch.zeros(4, 8, dtype=torch.float16)
    x, out = torch.zeros(1, 8), torch.empty(1, 4)
    cast = helper.ffi.cast
    status = helper.lib.gemv_f16(cast("float *", x.data_ptr()), 0, cast("uint16_t *", w.data_ptr()),
                                 4, 8, cast("float *", out.data_ptr()), 1)
    assert status == helper.lib.KH_EINVAL
