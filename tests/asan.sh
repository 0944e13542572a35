#!/usr/bin/env bash
# `make test-asan`: tests/ops and tests/engine against a C helper built with AddressSanitizer
# and UndefinedBehaviorSanitizer (KIMI_HELPER_SANITIZE=address,undefined, read by
# engined/_helper_build.py). It is built in a copy of the tree, so the normal
# engined/_kimi_helper*.so is untouched. Python is not instrumented, so libasan is preloaded
# (its runtime must come first); leaks are not checked (CPython and torch keep memory until
# exit by design); any UBSan report fails the run (-fno-sanitize-recover=all, halt_on_error).
#
#   bash tests/asan.sh [pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d /tmp/kimi-asan.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$root"
git ls-files -co --exclude-standard | grep -v '\.so$' | tar -cf - -T - | tar -xf - -C "$work"
cd "$work"
echo "building the sanitized helper in $work"
KIMI_HELPER_SANITIZE=address,undefined \
    "$python" setup.py -q build_ext --inplace --build-temp "$work/build" >/dev/null 2>&1 \
    || { echo "sanitized build failed" >&2; exit 1; }
libasan=$(${CC:-cc} -print-file-name=libasan.so)
[ -f "$libasan" ] || { echo "no libasan.so from ${CC:-cc} -print-file-name" >&2; exit 2; }
export LD_PRELOAD=$libasan
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
"$python" - <<'PY'
import os
import engined
from engined import helper
helper.require()
assert engined.__file__.startswith(os.getcwd()), engined.__file__
maps = open("/proc/self/maps").read()
assert "libasan" in maps and "libubsan" in maps, "the helper was not built with the sanitizers"
print("sanitized helper in", os.path.dirname(engined.__file__))
PY
# The sanitized kernels run about 2-3x slower: the default-model tests need more than 300 s.
"$python" -m pytest -q -p no:cacheprovider -o timeout=1200 tests/ops tests/engine "$@"
