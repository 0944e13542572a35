#!/usr/bin/env bash
# The GPU benchmarks and GPU-marked tests, in sections that run alone, each under its own time
# limit, on a GPU machine's own image (python 3.12, torch 2.11, triton 3.6, numpy, click and
# pytest; no cffi, llguidance, fla-core, flask, gevent or gguf; no network; bench/gpu_image.txt
# lists it): every script it runs needs only what the image has, `make gpu-carry`'s wheels, and
# engined. The dry run in make test hides every other module from its processes.
#
#   bash bench/gpu_run.sh [--dry-run] [quick] [kernels] [prefill] [serve] [long] [offload]   # default: all
#
# Sections, with their limits, cheapest and most decisive first. One command of a GPU lease
# runs at most 600 s: `quick kernels serve` (120 + 150 + 240 = 510 s, under a 540-s budget
# with the start-up checks: a section's steps run under their own limits, which with their
# 5-s kill graces add up to its limit or less (quick: nvidia-smi 10 s, two version prints of a
# few seconds, gpu_quick 100 s), so a section's own 15-s grace is spent only on a process that
# ignores SIGTERM) is one command and
# `offload` (350 s, timeout_s 400) another. A
# lease brings back at most 8 files of its $OUT, and a run writes more: the results go to a
# folder of their own and only the bundle of them (BUNDLE, see Output) to the lease's $OUT.
# The device call:
#   command: BUNDLE=$OUT/gpu-run.tar.gz OUT=/tmp/gpu-run bash bench/gpu_run.sh quick kernels serve
#   timeout_s: 540          (BUNDLE first: it takes the lease's $OUT before OUT is set anew;
#                           each command its own OUT: on a warm machine /tmp stays, and a
#                           second run in the same OUT would record the first one's lines again)
#   carry:   [".gpu-carry/wheels"]   (`make gpu-carry` first: llguidance, which serve
#                           imports, and fla-core, whose chunk_kda is the KDA prefill on
#                           CUDA, are not on the image)
#   quick    120 s  the environment (nvidia-smi, torch, CUDA and triton versions), then
#                   bench/gpu_quick.py: synthetic:kimi-linear-48b INT4, batch-1 decode in
#                   process under the engine's CUDA graph runner (3 runs of 32 tokens, vs the
#                   roofline; this is the INT4 decode line of the run's record; the short
#                   prompts prefill through KDA's reference, not fla's autotuned kernels), then one
#                   decode step under torch.profiler, as a graph replay and as an eager
#                   model.decode_rows: kernels per step, GPU-busy vs wall ms, the top 15
#                   kernels; then Kimi-Linear verify, k drafts as k + 1 rows of one eager
#                   step against one row, and both rollbacks of a rejected draft (issue 26).
#                   quick.json and quick.txt are written as each phase ends. Beside it, in
#                   the background on the CPU alone, the kernel counter (bench/model_step.py
#                   --count-kernels, TRITON_INTERPRET=1) on the same step: kernel-count.txt,
#                   whose "kernels per decode step" the profiler's count should equal.
#   kernels  150 s  bench/int4_kernels.py (every cuda variant of the INT4 GEMV ops at Kimi-Linear
#                   shapes, both INT4 schemes, timed by CUDA-graph replay, GB/s against the
#                   device's measured copy bandwidth; 45 s); the gpu-marked tests
#                   (tests/ops/test_gpu.py, all 47, the served-step graph test first, its
#                   prompts prefilled by KDA's reference, not fla's autotuned kernels; 100 s:
#                   the first run took 55 s for 21, mostly first-call Triton compiles and
#                   random 256-expert banks, which the module now makes once; a step cut at
#                   its limit keeps the results printed before). BF16=1 adds
#                   `python -m engined.commands.bench` BF16 decode (beyond the limit unless
#                   kernels runs alone).
#   prefill  150 s  the prefill path's gpu-marked tests (issue 29), its own command
#                   (`BUNDLE=$OUT/gpu-run-prefill.tar.gz OUT=/tmp/gpu-run-prefill bash
#                   bench/gpu_run.sh prefill`, timeout_s 200, carry .gpu-carry/wheels):
#                   fla-core's chunk_kda against our chunk form (T = 1000, 64, 7 at 48B head
#                   sizes, from a nonzero state), the Triton W4A16 GEMM at q/k/v, o_proj and
#                   expert shapes (M = 9, 256, 2048), moe_grouped's tl.dot variant on a
#                   256-token chunk at expert shapes, MLA's lower-right causal SDPA, and the
#                   chunk's short convs, gated output norm and router (test_prefill_ops_gpu.py).
#   serve    240 s  bench/serve_streams.py: `python -m engined serve --model
#                   synthetic:kimi-linear-48b`, through its socket: at start, before any
#                   request, the batch-1 roofline, the decode graphs captured and the peak
#                   device memory (saved at once); decode at 1 and 8 streams of 256 tokens,
#                   over the window where every stream decodes; TTFT at 8k, then at 32k
#                   prompt tokens; the 32k prefill again with a greedy stream decoding
#                   beside it (bench/beside.py: its slowest gap against its lone step,
#                   issue 29), last; graph capture failures and peak memory again.
#   long     240 s  bench/serve_streams.py --streams none --prefill 131072 --name long: an
#                   engine of its own at --max-context 131200, the 128k-token TTFT (issue 29:
#                   <= 15 s), its own command: `BUNDLE=$OUT/gpu-run-long.tar.gz
#                   OUT=/tmp/gpu-run-long bash bench/gpu_run.sh long`, timeout_s 280, carry
#                   [".gpu-carry/wheels"].
#   offload  350 s  tests/models/test_gpu_offload.py (the piecewise decode step captured
#                   around the CPU experts, and the expert cache in it; 70 s: 60 s when last
#                   run, mostly first-call Triton compiles), then bench/offload.py (275 s;
#                   estimated, not yet run in this form: each 48B engine starts in 30-80 s,
#                   the most for --cpu-moe, whose experts are all made in RAM):
#                   synthetic:kimi-linear-48b served three times, every engine's MoE layers in
#                   RAM following bench/data/route-trace-claude-tool.json.gz (a real Claude
#                   Code turn recorded on the tiny checkpoint by bench/route_trace.py, spread
#                   to 256 experts, top-8; KIMI_ROUTE_TRACE): `--gpu-memory 24GiB` (the expert
#                   cache at its planned default; batch-1 decode, 2 runs of 64 tokens, and the
#                   8k-token prefill TTFT, for the peak), then `--cpu-moe --moe-cache 0`
#                   (every routed expert in RAM, run by the C helper on all 16 CPU threads;
#                   left to itself the cache would take most of an H200; three of the five
#                   verdicts need this row, so it is second) and `--gpu-memory 24GiB
#                   --moe-cache 0`, batch-1 decode only; peak device memory (CUDA context included),
#                   the placement and cache the engine logged, its offload counters and cache
#                   hit rate; the host's RAM read bandwidth (the helper's read_probe) and the
#                   decode rate it caps the CPU part at.
# Goals on an H200 (issue 15): served batch-1 decode >= 60% of the roofline; 8 streams >= 5x
# one; 32k-token prefill <= 3 s. Issue 29: 128k-token prefill <= 15 s; a stream decoding
# beside the 32k prefill, no gap between its tokens over 2x its lone step. Issue 30 (16
# cores, 128 GiB RAM): --cpu-moe decode >= 60% of the RAM-bandwidth cap; --gpu-memory 24GiB
# decode >= 2.5x --cpu-moe, its peak <= 24 GiB; with the expert cache >= 1.25x without it.
#
# Engines: every engine a bench script starts runs in its own process group, logs to
# $OUT/serve-engine.log, $OUT/long-engine.log or $OUT/offload-NAME-engine.log, and is stopped,
# group and all, when its script ends, SIGTERM from a time limit included (bench/served.py).
# Each engine's group id sits in a private folder (KIMI_BENCH_PIDS) while it runs; after each
# step and section this script kills any group left there (a script killed before it could stop
# its engine). PYTHONUNBUFFERED=1 for everything, so a log killed at a limit holds all that was
# printed.
#
# The C helper on the GPU image (the offload section needs it; without it offload.py stops at
# once and says this): the image cannot build it (no cffi, no network), so it is carried
# there. `make gpu-carry` on the build machine fetches the cp312 wheels of what the built
# helper imports: cffi (its _cffi_backend, the version that built the helper) and numpy
# (engined/helper/ imports it beside the helper; the image's own is kept), llguidance (the
# engine's grammars, imported when serve starts), and fla-core with einops (pure Python, the
# CUDA KDA prefill), ~21 MB in .gpu-carry/wheels. Then the
# session's device tool runs, as one call (its carry takes ignored paths, 64 MiB in all):
#   command: BUNDLE=$OUT/gpu-run-offload.tar.gz OUT=/tmp/gpu-run-offload bash bench/gpu_run.sh offload
#   timeout_s: 400          (the section's 350 s, its 15-s kill grace, ~20 s of start-up:
#                           the wheels unpacked, torch's CUDA check; ~10 s to bundle and record)
#   carry:   ["engined/_kimi_helper.abi3.so", ".gpu-carry/wheels"]
# Here the wheels that match the running python (cp312 or abi3 there; none on the build
# machine's 3.11) are unpacked into .gpu-carry/cpXY unless that python imports them already,
# and that folder and the repository (the bench scripts import engined uninstalled) go on
# PYTHONPATH.
#
# Output, written as each section goes, under $OUT (default bench/results/gpu-DATE): NAME.log
# for each section, quick.json, quick.txt, kernels-gemv.json, serve.json, long.json,
# offload.json, the engine logs, summary.txt (each section's status and seconds),
# RESULTS.add.md (the scripts' result lines and one line for the whole run), gpu_run-DATE.json
# (the run's record: those lines as its table; copy it into bench/results/ and run
# bench/results_md.py to show it in bench/RESULTS.md); and $BUNDLE (default
# $OUT/gpu-run.tar.gz): all of these in one file, remade every BUNDLE_EVERY seconds while a
# section runs, after each section, and on SIGTERM or SIGINT: a command the lease cuts short
# still brings back what its scripts had saved.
#
# --dry-run: the same sections on the CPU, no GPU needed: gpu_quick.py --dry-run (synthetic
# tiny, its aten ops profiled); int4_kernels.py's CPU variants with an 8 MiB working set; the
# gpu-marked tests collected, not run; synthetic:small served with 1 and 2 streams of 16
# tokens and a 256-token prefill (again beside a decoding stream), long's at 1,024 tokens;
# offload's CPU tests of the piecewise step and the expert cache (what its GPU tests
# capture), then its placements --cpu-moe and --n-cpu-moe 1 (on the
# CPU --gpu-memory is ignored) served with 8 tokens and a 256-token prefill, a 64 MiB probe,
# their experts in RAM following the checked-in route trace (spread to 32 experts, top-4).
# OUT defaults to a temporary folder and nothing is recorded. `make test` runs
# it (tests/blackbox/test_gpu_run_script.py; 40-80 s on 2 shared cores), so the script is tested
# before its one GPU shot. Env: PYTHON (default python3), OUT, BUNDLE, BUNDLE_EVERY (20), BF16.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
declare -A LIMIT=([quick]=120 [kernels]=150 [prefill]=150 [serve]=240 [long]=240 [offload]=350)
SKIPPED=77  # a section's exit status for "not run here", as automake's test harness reads it
export PYTHONUNBUFFERED=1

step() {  # step SECONDS COMMAND...: one command of a section; a failure fails the section
  local limit=$1 rc
  shift
  echo "+ $*"
  timeout --foreground -k 5 "$limit" "$@"
  rc=$?
  kill_engines
  case $rc in
    0) ;;
    124|137) echo "step timed out at its $limit s limit: $*"; FAILED=1 ;;
    *) echo "step failed (exit $rc): $*"; FAILED=1 ;;
  esac
}

kill_engines() {  # the process group of every engine whose bench script did not stop it
  local pidfile pgid
  for pidfile in "$KIMI_BENCH_PIDS"/*; do
    [ -f "$pidfile" ] || continue
    pgid=${pidfile##*/}
    if kill -0 -- "-$pgid" 2>/dev/null; then
      echo "gpu_run.sh: stopping the engine process group $pgid its bench script left"
      kill -TERM -- "-$pgid" 2>/dev/null
      sleep 3
      kill -KILL -- "-$pgid" 2>/dev/null
    fi
    rm -f "$pidfile"
  done
}

section_quick() {
  if command -v nvidia-smi >/dev/null; then
    timeout 10 nvidia-smi
  else
    echo "nvidia-smi: not on this machine"
  fi
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
            "CUDA", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available()
            else "(no CUDA device)")'
  "$PY" -c 'import triton; print("triton", triton.__version__)' || echo "triton: not importable"
  # the CPU's count of the same step's kernels, beside the profiler's (issue 24: equal): on the
  # CPU alone, in the background from the start of gpu_quick (a few seconds, mostly while it
  # builds its model; one thread at the lowest priority, so the host-side timings it might
  # overlap keep their cores); in the section's process group (--foreground), so the
  # section's limit ends it too; informative, so its failure fails nothing
  nice -n 19 env OMP_NUM_THREADS=1 TRITON_INTERPRET=1 timeout --foreground 60 "$PY" \
    bench/model_step.py --count-kernels >"$OUT/kernel-count.txt" 2>&1 &
  local counter=$!
  if [ "$DRY" = 1 ]; then
    step 100 "$PY" bench/gpu_quick.py --dry-run --out "$OUT"
  else
    step 100 "$PY" bench/gpu_quick.py --out "$OUT" --record "$OUT/RESULTS.add.md"
  fi
  wait "$counter"
  echo "the CPU's kernel counter (exit $?), bench/model_step.py --count-kernels:"
  tail -n 2 "$OUT/kernel-count.txt"
}

section_kernels() {
  if [ "$DRY" = 1 ]; then
    step 90 "$PY" bench/int4_kernels.py --device cpu --no-record --working-set-mib 8 --min-time 0.02
  else
    step 45 "$PY" bench/int4_kernels.py --device cuda
    gemv=$(ls -t bench/results/gemv-cuda-*.json 2>/dev/null | head -n 1)
    [ -z "$gemv" ] || cp "$gemv" "$OUT/kernels-gemv.json"
  fi
  if ! "$PY" -c 'import pytest' 2>/dev/null; then
    echo "pytest is not on this image: GPU-marked tests not run (pip install pytest, then rerun)"
  elif [ "$DRY" = 1 ]; then
    step 60 "$PY" -m pytest -q --collect-only -m gpu -p no:cacheprovider tests/ops/test_gpu.py
  else
    step 100 "$PY" -m pytest -v --durations=10 -m gpu -p no:cacheprovider tests/ops/test_gpu.py
  fi
  if [ "$DRY" != 1 ] && [ "${BF16:-0}" = 1 ]; then  # beyond the section's limit unless alone
    step 120 "$PY" -m engined.commands.bench --synthetic kimi-linear-48b --device cuda \
      --record "$OUT/RESULTS.add.md"
  fi
}

section_prefill() {  # needs fla-core: `make gpu-carry`'s wheels, carried
  local tests=(tests/ops/test_kda_prefill.py tests/ops/test_w4a16_gemm_triton.py
               tests/ops/test_moe_grouped_dot.py tests/models/test_kimi_mla_moe.py
               tests/ops/test_prefill_ops_gpu.py)
  if ! "$PY" -c 'import pytest' 2>/dev/null; then
    echo "pytest is not on this image: the prefill tests not run (pip install pytest, then rerun)"
  elif [ "$DRY" = 1 ]; then
    step 60 "$PY" -m pytest -q --collect-only -m gpu -p no:cacheprovider "${tests[@]}"
  else
    step 145 "$PY" -m pytest -v --durations=10 -m gpu -p no:cacheprovider "${tests[@]}"
  fi
}

section_serve() {
  if [ "$DRY" = 1 ]; then
    step 120 "$PY" bench/serve_streams.py --model synthetic:small --device cpu --threads 2 \
      --streams 1,2 --prefill 256 --new-tokens 16 --runs 1 --bandwidth-mib 64 --out "$OUT"
  else
    step 235 "$PY" bench/serve_streams.py --model synthetic:kimi-linear-48b --device cuda \
      --start-timeout 150 --out "$OUT" --record "$OUT/RESULTS.add.md"
  fi
}

section_long() {  # issue 29's 128k-token TTFT: an engine of its own, --max-context 131200
  if [ "$DRY" = 1 ]; then
    step 90 "$PY" bench/serve_streams.py --model synthetic:small --device cpu --threads 2 \
      --streams none --prefill 1024 --no-beside --name long --bandwidth-mib 64 --out "$OUT"
  else
    step 235 "$PY" bench/serve_streams.py --model synthetic:kimi-linear-48b --device cuda \
      --streams none --prefill 131072 --no-beside --name long --start-timeout 150 \
      --out "$OUT" --record "$OUT/RESULTS.add.md"
  fi
}

section_offload() {  # offload.py exits 2 at once, saying how to carry it, without the helper
  local trace=bench/data/route-trace-claude-tool.json.gz
  if ! "$PY" -c 'import pytest' 2>/dev/null; then
    echo "pytest is not on this image: the offload GPU tests not run"
  elif [ "$DRY" = 1 ]; then
    step 60 "$PY" -m pytest -q --collect-only -m gpu -p no:cacheprovider tests/models/test_gpu_offload.py
    # what the GPU tests capture, run on the CPU: the piecewise step around the experts in RAM
    # (faked capture and replay included) and the expert cache with a CPU "device" pool
    step 90 "$PY" -m pytest -q -rA -p no:cacheprovider tests/models/test_kimi_piecewise.py \
      tests/models/test_expert_cache.py
  else
    step 70 "$PY" -m pytest -v -m gpu -p no:cacheprovider tests/models/test_gpu_offload.py
  fi
  if [ "$DRY" = 1 ]; then
    step 90 "$PY" bench/offload.py --model synthetic:small --device cpu --threads 2 \
      --placements cpu-moe,n-cpu-moe=1 --new-tokens 8 --runs 1 --prefill 256 --probe-mib 64 \
      --route-trace "$trace" --start-timeout 60 --out "$OUT"
  else
    step 275 "$PY" bench/offload.py --model synthetic:kimi-linear-48b --device cuda \
      --placements gpu-memory=24GiB,cpu-moe+moe-cache=0,gpu-memory=24GiB+moe-cache=0 \
      --decode-only gpu-memory=24GiB+moe-cache=0,cpu-moe+moe-cache=0 --runs 2 \
      --route-trace "$trace" --start-timeout 120 --out "$OUT" --record "$OUT/RESULTS.add.md"
  fi
}

use_carried_wheels() {  # `make gpu-carry`'s wheels for this python, unless it has them already
  local tag wheel module
  tag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])') || return 1
  for wheel in .gpu-carry/wheels/*-"$tag"-"$tag"-*.whl .gpu-carry/wheels/*-abi3-*.whl \
      .gpu-carry/wheels/*-py3-none-any.whl; do
    [ -f "$wheel" ] || continue
    module=${wheel##*/}
    module=${module%%-*}
    [ "$module" = cffi ] && module=_cffi_backend  # all the built helper imports of cffi
    [ "$module" = fla_core ] && module=fla        # KDA prefill's chunk_kda (pure Python)
    "$PY" -c "import $module" 2>/dev/null && continue
    "$PY" -m zipfile -e "$wheel" ".gpu-carry/$tag" || return 1
    echo "gpu_run.sh: $module from the carried ${wheel##*/}"
  done
  [ ! -d ".gpu-carry/$tag" ] || export PYTHONPATH=$PWD/.gpu-carry/$tag:$PYTHONPATH
}

run_section() {  # the whole section under its limit, in its own process group (timeout's)
  local name=$1 start=$SECONDS rc status
  timeout -k 15 "${LIMIT[$name]}" "$BASH" "$0" "${DRY_FLAG[@]}" --in-section "$name" 2>&1 |
    tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  kill_engines 2>&1 | tee -a "$OUT/$name.log"
  case $rc in
    0) status=ok ;;
    "$SKIPPED") status="skipped, $(tail -n 1 "$OUT/$name.log")" ;;
    124|137) status="timed out at its ${LIMIT[$name]} s limit"; FAILED=1 ;;
    *) status="failed (exit $rc)"; FAILED=1 ;;
  esac
  echo "$name: $status, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

record_run() {  # RESULTS.add.md as the table of the run's record, gpu_run-DATE.json in $OUT
  "$PY" -c 'import sys; sys.path.insert(0, "bench"); import common, pathlib
lines = pathlib.Path(sys.argv[1]).read_text().splitlines()
print("wrote", common.record("gpu_run", {"hardware": sys.argv[2]}, "GPU run: " + sys.argv[3],
                             "bash bench/gpu_run.sh " + sys.argv[3], lines, pathlib.Path(sys.argv[4])))' \
    "$RESULTS" "$1" "${SECTIONS[*]}" "$OUT"
}

bundle() {  # everything under $OUT in one file: a lease brings back at most 8 files
  local part=$KIMI_BENCH_PIDS.$BASHPID.tar.gz  # one per caller: the periodic one may overlap
  tar -C "$OUT" --exclude="./${BUNDLE##*/}" -czf "$part" . 2>/dev/null
  [ $? -le 1 ] && mv -f "$part" "$BUNDLE"  # 1: a file changed while read, still a good archive
}

bundle_every() {  # the bundle remade every $1 s, in the background, while a section runs
  while sleep "$1" && kill -0 "$$" 2>/dev/null; do bundle; done  # ends with the script
}

DRY=0
DRY_FLAG=()
SECTIONS=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1; DRY_FLAG=(--dry-run) ;;
    --in-section)  # run_section's re-entry: one section, under the caller's timeout
      FAILED=0
      "section_$2"
      rc=$?
      [ "$rc" = "$SKIPPED" ] && exit "$rc"
      exit "$FAILED" ;;
    quick|kernels|prefill|serve|long|offload) SECTIONS+=("$1") ;;
    *) echo "usage: bash bench/gpu_run.sh [--dry-run] [quick] [kernels] [prefill] [serve] [long] [offload]" >&2
       exit 2 ;;
  esac
  shift
done
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(quick kernels prefill serve long offload)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # engined for the bench scripts, uninstalled
use_carried_wheels || exit 1
if [ "$DRY" = 1 ]; then
  OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/kimi-gpu-dry-run.XXXXXX")}
else
  OUT=${OUT:-bench/results/gpu-$(date +%F)}
  "$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"' || exit 1
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUNDLE=${BUNDLE:-$OUT/gpu-run.tar.gz}
RESULTS=$OUT/RESULTS.add.md  # the scripts' --record lines
KIMI_BENCH_PIDS=$(mktemp -d "${TMPDIR:-/tmp}/kimi-bench-pids.XXXXXX")
export OUT KIMI_BENCH_PIDS
keeper=
trap 'kill $keeper 2>/dev/null; kill_engines; rm -rf "$KIMI_BENCH_PIDS" "$KIMI_BENCH_PIDS".*.tar.gz' EXIT
trap 'kill_engines; bundle; exit 143' TERM
trap 'kill_engines; bundle; exit 130' INT
echo "gpu_run.sh: sections ${SECTIONS[*]}${DRY_FLAG[*]:+ (dry run on the CPU)}; results in $OUT"
: > "$OUT/summary.txt"
FAILED=0
for name in "${SECTIONS[@]}"; do
  bundle_every "${BUNDLE_EVERY:-20}" &
  keeper=$!
  run_section "$name"
  kill "$keeper" 2>/dev/null
  wait "$keeper" 2>/dev/null
  bundle
done
if [ "$DRY" != 1 ]; then
  gpu=$("$PY" -c 'import torch; print(torch.cuda.get_device_name())')
  sections=$(paste -sd ';' "$OUT/summary.txt" | sed 's/;/; /g')
  echo "- $(date +%F) \`bash bench/gpu_run.sh ${SECTIONS[*]}\` on $gpu: $sections" >> "$RESULTS"
  record_run "$gpu"
  bundle
fi
exit "$FAILED"
