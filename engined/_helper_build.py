"""cffi builder for the C helper (API mode, out of line): csrc/kimi_helper.{h,c}."""
import os
import pathlib
import re

from cffi import FFI

_CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"


def _cdef() -> str:
    # cffi's parser takes declarations only: drop preprocessor lines and comments.
    lines = []
    for line in (_CSRC / "kimi_helper.h").read_text().splitlines():
        s = line.strip()
        if s.startswith("#") and not s.startswith("#define KH_"):
            continue
        lines.append(line)
    text = "\n".join(lines)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _cflags() -> list[str]:
    # -Wall -Wextra: the helper builds without a warning (a new one is a finding, not noise).
    flags = ["-O3", "-std=c99", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra"]
    if os.environ.get("KIMI_NATIVE") == "1":
        flags.append("-march=native")  # only when building for this very machine
    return flags + _sanitize_flags()


def _sanitize_flags() -> list[str]:
    """KIMI_HELPER_SANITIZE=address,undefined (tests/asan.sh, `make test-asan`, which builds
    in a copy of the tree): the sanitizers, for the compiler and the linker; every UBSan
    finding is fatal, and frames stay for readable reports."""
    wanted = os.environ.get("KIMI_HELPER_SANITIZE")
    if not wanted:
        return []
    return [f"-fsanitize={wanted}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "engined._kimi_helper",
    '#include "kimi_helper.h"',
    sources=[f"csrc/{name}.c" for name in (  # relative: setuptools runs from the root
        "kimi_helper", "kimi_gemv", "kimi_moe", "kimi_moe_routes", "kimi_moe_tiles", "kimi_moe_w4a8",
        "kimi_moe_i16", "kimi_i16_simd",
        "kimi_i16_avx2", "kimi_probe", "kimi_gemv_avx2", "kimi_gemv_avx512", "kimi_pool", "kimi_w4a8", "kimi_w4a8_avx2", "kimi_gemm",
        "kimi_gemm_avx2", "kimi_q8", "kimi_w4a8_vnni", "kimi_llama", "kimi_act", "kimi_attn", "kimi_tiles",
        "kimi_tiles_simd", "kimi_tiles_i16", "kimi_tile_layout", "kimi_tiles_i16_simd", "kimi_tiles_amx", "kimi_q8_tiles", "kimi_q8_tiles_simd", "kimi_kda", "kimi_attn_avx2",
        "kimi_attn_avx512")],
    include_dirs=["csrc"],
    # the headers too: setuptools rebuilds only when a source or a dependency is newer than the
    # module, and a kernel body lives in a header (kimi_gemv_body.h) that its includers compile
    depends=sorted(str(p) for p in pathlib.Path("csrc").glob("*.h")),
    extra_compile_args=_cflags(),
    extra_link_args=["-lpthread", "-lm"] + _sanitize_flags(),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
