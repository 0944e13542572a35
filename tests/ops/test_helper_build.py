"""The C helper's build (engined/_helper_build.py): compiled with every common warning on, so
a new warning shows at `make setup` (the sources build clean)."""
import pytest

pytest.importorskip("cffi")  # the GPU image builds nothing

from engined import _helper_build  # noqa: E402


def test_the_helper_compiles_with_all_and_extra_warnings():
    flags = _helper_build._cflags()
    assert {"-Wall", "-Wextra"} <= set(flags)
    assert not [f for f in flags if f.startswith("-Wno-")]  # none silenced wholesale
