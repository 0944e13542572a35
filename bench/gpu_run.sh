#!/usr/bin/env bash
# Every GPU benchmark and GPU-marked test, on a GPU machine's own image (python 3.12,
# torch 2.11, triton 3.6; no cffi/flask/gevent/gguf, no network). Budget: 8 minutes.
# Run from the repository root:
#   bash bench/gpu_run.sh        # BF16=1 also runs the BF16 synthetic model
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${RESULTS:-bench/RESULTS.md}
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.cuda.get_device_name())'
[ -f "$RESULTS" ] || printf '# Benchmark results\n\nAppend-only; each line names its hardware and conditions.\n\n' > "$RESULTS"
# 1. Triton GEMV kernels at the full Kimi-Linear decode shapes, against the device peak.
timeout 150 "$PY" bench/kernels.py --device cuda
# 2. The synthetic full-size Kimi-Linear-48B decode (INT4, selective plan).
timeout 240 "$PY" -m engined.commands.bench --synthetic kimi-linear-48b --int4 --device cuda --record "$RESULTS"
if [ "${BF16:-0}" = 1 ]; then
  timeout 240 "$PY" -m engined.commands.bench --synthetic kimi-linear-48b --device cuda --record "$RESULTS"
fi
# 3. GPU-marked tests (equivalence at full shapes), when the image has pytest.
if "$PY" -c 'import pytest' 2>/dev/null; then
  timeout 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_gpu.py
else
  echo "pytest is not on this image: GPU-marked tests not run (pip install pytest, then rerun)"
fi
