"""Cases named for a SIMD level run at that level or skip: a cap only lowers the level, so on a
CPU without the named one a lower kernel would run, and pass, under the higher name. The skip
reason names the level that ran (pytest -rs). Callers restore the default cap (in a finally);
tests/support/as_avx2.py runs a suite as an AVX2-only CPU would."""
import pytest
import torch

from engined import helper


def level_ids(names: dict[int, str]) -> list[str]:
    """Test ids for sorted(names): "portable-c", "avx2", "avx-512", "avx-512-vnni", ..."""
    return [names[level].lower().replace(" ", "-") for level in sorted(names)]


def gemv_levels(doc: str = "Each fp32-dot kernel level this CPU has (the others skip)."):
    """A `level` fixture over helper.SIMD_LEVELS: each case capped there, the default cap (2)
    restored after."""
    return _levels(gemv_level_or_skip, helper.gemv_simd, helper.SIMD_LEVELS, 2, doc)


def int8_levels(doc: str = "Each integer-dot kernel level this CPU has (the others skip)."):
    """A `level` fixture over helper.INT8_LEVELS, the default cap (3) restored after."""
    return _levels(int8_level_or_skip, helper.w4a8_simd, helper.INT8_LEVELS, 3, doc)


def _levels(or_skip, cap, names: dict[int, str], default: int, doc: str):
    @pytest.fixture(params=sorted(names), ids=level_ids(names))
    def level(request):
        try:
            yield or_skip(request.param)
        finally:
            cap(default)
    level.__doc__ = doc
    return level


def gemv_level_or_skip(level: int) -> int:
    """Cap the fp32-dot kernels at `level` (helper.SIMD_LEVELS) and skip unless it runs."""
    return _run_or_skip(helper.gemv_simd, helper.SIMD_LEVELS, level)


def int8_level_or_skip(level: int) -> int:
    """Cap the integer-dot kernels (W4A8, the Q8_0 head) at `level` (helper.INT8_LEVELS) and
    skip unless it runs."""
    return _run_or_skip(helper.w4a8_simd, helper.INT8_LEVELS, level)


def _run_or_skip(cap, names: dict[int, str], level: int) -> int:
    ran = cap(level)  # the level the helper says runs: the cap, then what this CPU has
    if ran != level:
        pytest.skip(f"asks for {names[level]}, but {names[ran]} ran "
                    f"(this CPU has no {names[level]})")
    print(f"\n{names[level]} ran")
    return ran


@pytest.fixture
def amx():
    """Skips unless the tile kernels (tiles_w4a8, tiles_q8) run AMX here; the switch is back on
    after."""
    if not helper.tiles_amx():
        pytest.skip(f"no AMX tile kernel: this CPU or its kernel lends no AMX-INT8 tiles, or "
                    f"the tile level is {helper.INT8_LEVELS[helper.tiles_simd()]}")
    yield
    helper.tiles_amx(True)


def check_amx_bits(run, x: torch.Tensor, row_counts, min_rows: int):
    """run(x[:rows]) (a tile op) for each count: AMX ran exactly when rows >= min_rows (one call
    more in tiles_amx_calls), with the bits of the same call with AMX off; then the portable C
    text on all of x gives the last count's bits (the counts end at len(x))."""
    for rows in row_counts:
        before = helper.tiles_amx_calls()
        got = run(x[:rows])
        assert helper.tiles_amx_calls() == before + (rows >= min_rows), rows
        helper.tiles_amx(False)
        try:
            assert not helper.tiles_amx()
            assert torch.equal(got, run(x[:rows])), rows
        finally:
            helper.tiles_amx(True)
    assert rows == len(x)
    helper.w4a8_simd(0)
    try:
        assert torch.equal(run(x), got)
    finally:
        helper.w4a8_simd(3)
