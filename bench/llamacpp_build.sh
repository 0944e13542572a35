#!/usr/bin/env bash
# Native llama-server and llama-bench: the baselines a user would pick (issue 26), built from
# the llama.cpp sources vendored in the pinned llama-cpp-python sdist, with llama.cpp's own
# default, fastest configuration (GGML_NATIVE: this CPU's SIMD).
#
#   bash bench/llamacpp_build.sh          # prints the directory holding the two binaries
#
# The build is cached by the CPU's flags, not by version alone: a cache made on an AVX2-only
# host is never used on an AVX-512 one (or the reverse). Cache: $KIMI_LLAMACPP_CACHE, default
# ~/.cache/kimi-llamacpp/<version>-<hash of /proc/cpuinfo's flags>/. It takes ~20 minutes on
# 2 cores the first time; the sdist comes from the package registry (pip download).
set -euo pipefail

VERSION=0.3.36
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | xargs -n1 | sort | xargs)
KEY=$(printf '%s' "$FLAGS" | sha256sum | cut -c1-12)
CACHE=${KIMI_LLAMACPP_CACHE:-$HOME/.cache/kimi-llamacpp}
OUT=$CACHE/$VERSION-$KEY

if [ -x "$OUT/bin/llama-server" ] && [ -x "$OUT/bin/llama-bench" ]; then
  echo "$OUT/bin"
  exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "llama.cpp: building llama-server and llama-bench from llama-cpp-python $VERSION's sources into $OUT (first time ~20 min on 2 cores)" >&2
PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip download -q --no-deps --no-binary :all: \
  "llama-cpp-python==$VERSION" -d "$WORK" >&2
tar xzf "$WORK"/llama_cpp_python-$VERSION.tar.gz -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S "$SRC" -B "$WORK/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$WORK/build" --target llama-server llama-bench -j "$(nproc)" >&2
mkdir -p "$OUT/bin"
cp "$WORK/build/bin/llama-server" "$WORK/build/bin/llama-bench" "$OUT/bin/"
git -C "$SRC" rev-parse HEAD 2>/dev/null >"$OUT/commit" || \
  grep -rhoE 'LLAMA_BUILD_COMMIT[^"]*"[0-9a-f]+' "$WORK/build" 2>/dev/null | head -1 >"$OUT/commit" || true
printf '%s\n' "$FLAGS" >"$OUT/cpu-flags"
echo "$OUT/bin"
