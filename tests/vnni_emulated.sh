#!/usr/bin/env bash
# The VNNI kernels' tests on a machine without VNNI: builds a copy of the C helper whose
# AVX-512 VNNI and AVX-VNNI kernels run on SIMDe's portable stand-ins for the instructions
# (-DKH_VNNI_EMULATE; https://github.com/simd-everywhere/simde, header-only, MIT), then runs
# the integer-dot tests against it at every level. A developer's check, not part of
# `make test`: CI machines with VNNI run the real kernels in `make test`
# (tests/ops/test_w4a8.py, tests/ops/test_q8.py compare them with AVX2 bit for bit).
#
#   SIMDE_DIR=/path/to/simde bash tests/vnni_emulated.sh [pytest args]
# SIMDE_DIR holds simde/x86/avx512.h. Needs an x86 CPU with AVX2, FMA and F16C.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
: "${SIMDE_DIR:?set SIMDE_DIR to a SIMDe checkout (the folder holding simde/x86/avx512.h)}"
[ -f "$SIMDE_DIR/simde/x86/avx512.h" ] || { echo "no simde/x86/avx512.h under $SIMDE_DIR" >&2; exit 2; }
python=${PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d /tmp/kimi-vnni-emulated.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$root"
git ls-files -co --exclude-standard | grep -v '\.so$' | tar -cf - -T - | tar -xf - -C "$work"
cat > "$work/simde_vnni.h" <<'H'
/* Real AVX2 first, then SIMDe's AVX-512 (VNNI included) under the Intel names. */
#include <immintrin.h>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include "simde/x86/avx512.h"
/* AVX-VNNI's VEX form computes what the EVEX one does; SIMDe has only the latter. */
#define _mm256_dpbusd_avx_epi32(src, a, b) _mm256_dpbusd_epi32(src, a, b)
H
cd "$work"
echo "building the emulated helper in $work"
CFLAGS="-mavx2 -mfma -mf16c -Wno-psabi -DKH_VNNI_EMULATE -I$SIMDE_DIR -I$work" \
    "$python" setup.py -q build_ext --inplace --build-temp "$work/build" >/dev/null
"$python" - <<'PY'
import os
import engined
from engined import helper
assert engined.__file__.startswith(os.getcwd()), engined.__file__
print("emulated helper in", os.path.dirname(engined.__file__), "; each cap runs:",
      {helper.INT8_LEVELS[level]: helper.INT8_LEVELS[helper.w4a8_simd(level)]
       for level in (3, 2, 1, 0)})
PY
"$python" -m pytest -q -p no:cacheprovider tests/ops/test_w4a8.py tests/ops/test_w4a8_tiles.py tests/ops/test_q8.py \
    tests/ops/test_moe_grouped_w4a8.py tests/ops/test_moe_grouped_int16.py tests/ops/test_moe_grouped_tiles.py \
    tests/ops/test_moe_grouped_i16_tiles.py tests/ops/test_llama_layer.py tests/models/test_llama_decode_layer.py -rs "$@"
