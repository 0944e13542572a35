#!/usr/bin/env bash
# Kimi-Linear synthetic decode benchmark on a GPU machine's own image (python 3.12, torch 2.11,
# triton 3.6; no cffi/flask/gevent needed). Run from the repository root:
#   bash bench/gpu_run.sh            # INT4 (selective plan) then BF16, results appended to bench/RESULTS.md
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${RESULTS:-bench/RESULTS.md}
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.cuda.get_device_name())'
[ -f "$RESULTS" ] || printf '# Benchmark results\n\nAppend-only; each line names its hardware and conditions.\n\n' > "$RESULTS"
"$PY" -m engined.synthetic_bench --synthetic kimi-linear-48b --int4 --device cuda --record "$RESULTS"
if [ "${BF16:-0}" = 1 ]; then
  "$PY" -m engined.synthetic_bench --synthetic kimi-linear-48b --device cuda --record "$RESULTS"
fi
