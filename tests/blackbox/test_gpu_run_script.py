"""bench/gpu_run.sh, the one GPU shot: the modules and files it names exist, and its --dry-run
measures every section on the CPU as the GPU image would run it."""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from tests.blackbox.service_helpers import ROOT
from tests.support import gpu_image

BENCH = ROOT / "bench"


def test_gpu_run_names_modules_and_files_that_exist():
    text = (BENCH / "gpu_run.sh").read_text()
    modules = re.findall(r'-m (engined[\w.]+)', text)
    paths = re.findall(r'\b((?:bench|tests)/[\w/]+\.py)\b', text)
    assert modules and paths
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    for path in paths:
        assert (ROOT / path).is_file(), path
    out = subprocess.run([sys.executable, "-m", modules[0], "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--synthetic" in out.stdout, out.stderr


def test_gpu_run_dry_run_measures_every_section(tmp_path):
    """`bash bench/gpu_run.sh --dry-run`: the GPU run's sections on the CPU (synthetic tiny in
    process, synthetic:small served, tiny sizes), so the script is tested before its one GPU
    shot; nothing recorded. Every module the GPU image lacks and `make gpu-carry` does not
    carry is hidden from every process of the run, as it is there (tests/support/gpu_image.py):
    the engine's grammar import (llguidance) would have stopped serve and offload on it."""
    out, results_md = tmp_path / "out", (BENCH / "RESULTS.md").read_text()
    printed = tmp_path / "printed.txt"
    with printed.open("w") as sink:  # a file, not a pipe: polled below, never read till the end
        run = subprocess.Popen(["bash", str(BENCH / "gpu_run.sh"), "--dry-run"], cwd=ROOT,
                               env=gpu_image.env({**os.environ, "PYTHON": sys.executable,
                                                  "OUT": str(out), "BUNDLE_EVERY": "2"},
                                                 log=tmp_path / "hid.log"),
                               stdout=sink, stderr=subprocess.STDOUT, text=True)
        first_bundle = None  # the sections done when the bundle first appeared
        deadline = time.monotonic() + 300
        while run.poll() is None and time.monotonic() < deadline:
            if first_bundle is None and (out / "gpu-run.tar.gz").exists():
                first_bundle = (out / "summary.txt").read_text().count("\n")
            time.sleep(0.25)
        returncode = run.wait(timeout=max(1.0, deadline - time.monotonic()))
    assert returncode == 0, printed.read_text()[-6000:]
    # a lease that cuts the command short brings back the bundle: remade while quick ran
    assert first_bundle == 0
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["quick", "kernels", "prefill", "serve", "long",
                                                        "offload"]
    assert all(line.split(":")[1].startswith(" ok,") for line in summary), summary
    check_quick_dry_run(out)
    kernels = (out / "kernels.log").read_text()
    assert "| Kimi o_proj | 2304x4096 | cpu_c | asym |" in kernels
    assert "| Kimi o_proj | 2304x4096 | cpu_c | sym |" in kernels and "tests collected" in kernels
    assert "tests collected" in (out / "prefill.log").read_text()
    serve = json.loads((out / "serve.json").read_text())
    assert set(serve["decode_tok_s"]) == {"1", "2"}
    assert all(rate > 0 for rate in serve["decode_tok_s"].values())
    assert serve["generated_tokens"] > 0 and serve["decode_steps"]["eager"] > 0
    assert serve["spec_draft_tokens"] == 0  # plain decode: the engine drafted here by default
    prefill, roofline = serve["prefill"]["256"], serve["roofline"]
    assert prefill["prompt_tokens"] == 256 and prefill["ttft_s"] > 0
    assert roofline["bytes_per_token"] > 5e6 and roofline["bandwidth_gbs"] > 0
    assert roofline["pct"] > 0
    failures = serve["graph_capture_failures"]
    assert failures == "not exposed by this build" or isinstance(failures, float)
    assert serve["graphs"]["captured_buckets"] == [] and "device cpu" in serve["graphs"]["eager"]
    assert serve["peak_memory_at_start"]["bytes"] > 50 << 20, serve["peak_memory_at_start"]
    assert serve["peak_memory"]["bytes"] >= serve["peak_memory_at_start"]["bytes"]
    beside = serve["prefill_beside_decode"]  # the 256-token prefill again, a stream beside it
    assert "error" not in beside, beside  # says why, where a missing key would not
    assert beside["size"] == 256 and beside["prompt_tokens"] == 256 and beside["ttft_s"] > 0
    assert beside["outlived_prefill"] and "error" not in beside
    assert beside["slowest_step_s"] >= beside["lone_step_s"] > 0
    long = json.loads((out / "long.json").read_text())  # the 128k TTFT's engine, at 1,024 here
    assert list(long["prefill"]) == ["1024"] and long["prefill"]["1024"]["prompt_tokens"] == 1024
    assert long["decode_tok_s"] == {} and "prefill_beside_decode" not in long
    check_offload_dry_run(json.loads((out / "offload.json").read_text()))
    ran = (out / "offload.log").read_text()         # the piecewise step and the cache, on the CPU
    for module in ("test_kimi_piecewise.py", "test_expert_cache.py"):
        assert re.search(rf"^PASSED tests/models/{module}::", ran, re.M), ran[-2000:]
    assert not re.search(r"^(SKIPPED|FAILED|ERROR) ", ran, re.M), ran[-2000:]
    for log in ("serve", "long", "offload-cpu-moe", "offload-n-cpu-moe_1"):  # the engines' logs
        assert "kimi-engine: serving synthetic:small" in (out / f"{log}-engine.log").read_text()
    assert "serve-engine.log" in tar_names(out / "gpu-run.tar.gz")
    assert (BENCH / "RESULTS.md").read_text() == results_md
    hid = (tmp_path / "hid.log").read_text()  # gpu_run.sh's PYTHONPATH kept the hiding on
    for process in ("bench/gpu_quick.py", "engined serve", "pytest", "bench/offload.py"):
        assert process in hid, (process, hid[-2000:])


def test_the_dry_run_hides_what_the_gpu_image_lacks():
    """The hiding the dry run relies on: modules the image lacks fail to import in a child
    process, the carried ones (make gpu-carry) and the image's own import."""
    env = gpu_image.env({**os.environ})
    for module in ("flask", "gevent", "gguf", "cryptography"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "hidden: not on the GPU image" in done.stderr, module
    done = subprocess.run([sys.executable, "-c", "import llguidance, _cffi_backend, fla, numpy, "
                           "click, torch, triton"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def tar_names(path) -> set[str]:
    import tarfile
    with tarfile.open(path) as tar:
        return {pathlib.PurePath(name).name for name in tar.getnames()}


def check_quick_dry_run(out):
    """gpu_quick.py --dry-run: the versions, the in-process decode of synthetic tiny through
    the runner (eager on the CPU), and the two profiled steps (aten ops on the CPU)."""
    log = (out / "quick.log").read_text()
    assert re.search(r"^python 3\.\d+\.\d+ torch \S+", log, re.M) and "triton" in log
    quick = json.loads((out / "quick.json").read_text())
    assert quick["errors"] == {}
    assert quick["env"]["torch"] and quick["env"]["copy_bandwidth_gbs"] > 0
    decode = quick["decode"]
    assert decode["config"] == "tiny" and decode["tok_s"] > 0 and decode["mode"] == "eager"
    assert decode["decode_steps"] == {"eager at batch 1": 4 * 32}  # warm-up and 3 runs
    for key in ("profile_graph", "profile_eager"):
        profile = quick[key]
        assert profile["aten_ops"] > 10 and profile["wall_ms"] > 0, profile
        assert 0 < len(profile["top"]) <= 15 and profile["top"][0]["name"].startswith("aten::")
    verify = quick["verify"]          # bench/kimi_verify.py's k drafts as k + 1 rows
    assert [row["k"] for row in verify["rows"]] == [1, 2, 4, 8] and verify["one_row_ms"] > 0
    assert all(row["tok_s_accepted"] > row["tok_s_rejected"] > 0 for row in verify["rows"])
    text = (out / "quick.txt").read_text()
    assert "decode synthetic tiny INT4" in text and "profile eager model.decode_rows" in text
    assert "| verify k = 8 (9 rows) |" in text
    assert verify["snapshot_ms"] > 0 and "| rollback after every draft is rejected |" in text
    counted = (out / "kernel-count.txt").read_text()    # the CPU's counter, beside the profile
    assert re.search(r"^kernels per decode step: \d+$", counted, re.M), counted
    assert "kernels per decode step:" in log


def check_offload_dry_run(offload: dict):
    """--cpu-moe puts every MoE layer's routed experts in RAM and --n-cpu-moe 1 the first
    layer's, as the engine logged; the offload counters prove the hybrid path ran."""
    assert offload["ram_read"]["gbs"] > 0
    assert len(offload["routed_bytes_per_token_per_moe_layer"]) == 7  # synthetic:small
    rows = offload["placements"]
    assert list(rows) == ["cpu-moe", "n-cpu-moe=1"]
    for name, layers in (("cpu-moe", 7), ("n-cpu-moe=1", 1)):
        row = rows[name]
        assert row["placement"]["layers_in_ram"] == layers, row["placement"]
        assert row["offload"]["moe_calls"] > 0 and row["offload"]["bytes_to_host"] > 0, row
        assert row["decode_tok_s"]["1"] > 0 and row["prefill"]["256"]["prompt_tokens"] == 256
        assert row["ram_cap"]["tok_s"] > 0 and row["ram_cap"]["pct"] > 0
        assert row["peak_memory"]["bytes"] > 50 << 20
    assert rows["cpu-moe"]["offload"]["moe_calls"] > rows["n-cpu-moe=1"]["offload"]["moe_calls"]
