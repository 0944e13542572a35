"""A pytest plugin: the C helper as an AVX2-only CPU (the AVX2 CI kind) would run it, on an
x86 machine with more. Every cap asked of gemv_simd or w4a8_simd is lowered to AVX2 before it
reaches C, so the kernels that run and the levels the helper reports are that machine's; the
cases named for a higher level must then skip, saying which level ran:

    .venv/bin/python -m pytest -p tests.support.as_avx2 tests/ops/test_w4a8.py -rs
"""
from engined.helper import system

AVX2 = 1  # the same number in SIMD_LEVELS and INT8_LEVELS


class _CappedLib:
    """The cffi lib, but no cap above AVX2 gets through (-1 still only asks)."""

    def __init__(self, lib):
        self._lib = lib

    def gemv_simd(self, mode):
        return self._lib.gemv_simd(min(mode, AVX2))

    def w4a8_simd(self, mode):
        return self._lib.w4a8_simd(min(mode, AVX2))

    def __getattr__(self, name):
        return getattr(self._lib, name)


def pytest_configure(config):
    if system.lib is None or isinstance(system.lib, _CappedLib):
        return
    system.lib = _CappedLib(system.lib)
    system.lib.gemv_simd(AVX2)  # C's own calls ask gemv_simd(-1): lower the stored caps too
    system.lib.w4a8_simd(AVX2)
