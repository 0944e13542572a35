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
    flags = ["-O3", "-std=c99", "-D_POSIX_C_SOURCE=200809L"]
    if os.environ.get("KIMI_NATIVE") == "1":
        flags.append("-march=native")  # only when building for this very machine
    return flags


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "engined._kimi_helper",
    '#include "kimi_helper.h"',
    sources=["csrc/kimi_helper.c", "csrc/kimi_gemv.c", "csrc/kimi_moe.c", "csrc/kimi_moe_w4a8.c", "csrc/kimi_probe.c", "csrc/kimi_gemv_avx2.c",
             "csrc/kimi_gemv_avx512.c", "csrc/kimi_pool.c", "csrc/kimi_w4a8.c", "csrc/kimi_w4a8_avx2.c",
             "csrc/kimi_gemm.c", "csrc/kimi_gemm_avx2.c", "csrc/kimi_q8.c", "csrc/kimi_w4a8_vnni.c", "csrc/kimi_llama.c", "csrc/kimi_attn.c"],  # relative: setuptools runs from the root
    include_dirs=["csrc"],
    extra_compile_args=_cflags(),
    extra_link_args=["-lpthread", "-lm"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
