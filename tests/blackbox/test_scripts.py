"""What the suite does not import must still run: the bench scripts, the GPU run script,
the Makefile's helper check and `make run`'s launcher all name modules that can move."""
import contextlib
import http.client
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tests.blackbox.service_helpers import ROOT, free_port
from tests.support import gpu_image
from tests.support.engine import eventually, short_tmpdir, stop_process

BENCH = ROOT / "bench"
SCRIPTS_WITH_HELP = sorted(p.name for p in BENCH.glob("*.py") if "argparse" in p.read_text())
IMPORT_ONLY = sorted(p.name for p in BENCH.glob("*.py") if p.name not in SCRIPTS_WITH_HELP)


def test_every_bench_script_is_either_run_or_imported():
    assert set(SCRIPTS_WITH_HELP) >= {"decode.py", "int4_kernels.py", "proxy_overhead.py",
                                      "agent_turns.py", "model_step.py", "edit_turns.py"}
    assert set(IMPORT_ONLY) == {"common.py", "kernel_count.py", "llamacpp_run.py", "served.py",
                                "llamacpp_native.py", "structured_set.py", "beside.py"}


@pytest.mark.parametrize("script", SCRIPTS_WITH_HELP)
def test_bench_script_help(script):
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:"), out.stdout


def test_bench_helpers_import():
    """common.py is imported by the scripts; llamacpp_run.py runs in its own process beside
    llama-cpp-python (a bench-only dependency), so only its syntax and our imports are checked."""
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "common.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    compile((BENCH / "llamacpp_run.py").read_text(), "llamacpp_run.py", "exec")


def test_a_results_file_is_never_overwritten(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    paths = [common.write_json("decode", {"run": i}, tmp_path) for i in range(3)]
    assert len(set(paths)) == 3 and paths[1].name.endswith("-2.json")
    assert [json.loads(p.read_text())["run"] for p in paths] == [0, 1, 2]


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
    assert beside["size"] == 256 and beside["prompt_tokens"] == 256 and beside["ttft_s"] > 0
    assert beside["outlived_prefill"] and "error" not in beside
    assert beside["slowest_step_s"] >= beside["lone_step_s"] > 0
    long = json.loads((out / "long.json").read_text())  # the 128k TTFT's engine, at 1,024 here
    assert list(long["prefill"]) == ["1024"] and long["prefill"]["1024"]["prompt_tokens"] == 1024
    assert long["decode_tok_s"] == {} and "prefill_beside_decode" not in long
    check_offload_dry_run(json.loads((out / "offload.json").read_text()))
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


def test_offload_bench_stops_before_any_engine_without_the_helper(tmp_path):
    """The GPU image has no cffi: the hybrid path cannot run, and the message says how to
    carry the helper there (a numpy that fails to import stands in for the missing pieces)."""
    (tmp_path / "numpy.py").write_text("raise ImportError('no numpy on this image')\n")
    out = subprocess.run([sys.executable, str(BENCH / "offload.py"), "--out", str(tmp_path / "out")],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "make gpu-carry" in out.stderr and ".gpu-carry/wheels" in out.stderr
    assert not (tmp_path / "out").exists()


def test_offload_summary_says_how_the_steps_ran_and_what_failed_to_capture(monkeypatch):
    """A piecewise step that failed to capture decodes eagerly, still correct: the summary
    says so beside the rates, or a run measures eager decode as the hybrid graph's."""
    offload = bench_module("offload", monkeypatch)
    row = {"placement": {}, "decode_tok_s": {"1": 9.5}, "offload": {
        "moe_calls": 12, "decode_steps": {"eager": 40}, "graph_capture_failures": 3}}
    text = "\n".join(offload.summary({"model": "m", "device": "cuda", "host": "h", "threads": 16,
                                      "placements": {"cpu-moe": row}}))
    assert "decode steps 40 eager, graph capture failures 3" in text


def test_offload_goes_on_to_the_next_placement_whatever_the_first_raised(monkeypatch, tmp_path):
    """A stream that got a non-200 reply surfaces as a KeyError, a garbled one as a
    JSONDecodeError: the placement is recorded as failed and the next one is measured (it
    stopped the script, losing --cpu-moe's numbers, when only RuntimeError and OSError were
    caught)."""
    offload = bench_module("offload", monkeypatch)
    monkeypatch.setattr(offload, "helper_missing", lambda: None)
    monkeypatch.setattr(offload, "on_sigterm", lambda: None)
    monkeypatch.setattr(offload, "ram_read_bandwidth", lambda threads, mib: 2e10)
    monkeypatch.setattr(offload, "routed_bytes_per_token", lambda model: [1000])
    measured = []

    def measure(args, name, flags, row, save):
        measured.append(name)
        if len(measured) == 1:
            raise KeyError("chunks")  # common.concurrent_chunks after a stream's non-200 reply
        row["decode_tok_s"] = {"1": 5.0}

    monkeypatch.setattr(offload, "measure_placement", measure)
    code = offload.main(["--device", "cpu", "--out", str(tmp_path),
                         "--placements", "n-cpu-moe=1,cpu-moe"])
    rows = json.loads((tmp_path / "offload.json").read_text())["placements"]
    assert code == 1 and measured == ["n-cpu-moe=1", "cpu-moe"]
    assert rows["n-cpu-moe=1"]["error"] == "KeyError: 'chunks'"
    assert rows["cpu-moe"]["decode_tok_s"] == {"1": 5.0}


def test_serve_streams_records_what_it_measured_when_cut_short(monkeypatch, tmp_path):
    """The serve section's limit (SIGTERM -> SystemExit) during its last phase, the 32k prefill
    beside a stream: the rates measured before still reach --record, marked partial."""
    serve_streams = bench_module("serve_streams", monkeypatch)
    monkeypatch.setattr(serve_streams, "on_sigterm", lambda: None)
    monkeypatch.setattr(serve_streams, "copy_bandwidth", lambda device, mib: ("cpu", 1e10))

    def measure(args, result, save):
        result["decode_tok_s"] = {"1": 85.0, "8": 400.0}
        raise SystemExit(143)

    monkeypatch.setattr(serve_streams, "measure", measure)
    record = tmp_path / "RESULTS.add.md"
    with pytest.raises(SystemExit):
        serve_streams.main(["--device", "cpu", "--out", str(tmp_path), "--record", str(record)])
    line = record.read_text()
    assert "(partial: cut short)" in line and "decode 8 stream(s): 400.0 tok/s" in line
    assert json.loads((tmp_path / "serve.json").read_text())["partial"] is True


def test_gpu_quick_records_its_decode_line_before_the_later_phases(monkeypatch, tmp_path):
    """The run's headline goes to --record as soon as it is measured: a step cut at its limit
    during the profile or verify phases (here, an exit) keeps it."""
    gpu_quick = bench_module("gpu_quick", monkeypatch)

    def cut(*args):
        raise SystemExit(124)

    monkeypatch.setattr(gpu_quick, "measure_profile", cut)
    record = tmp_path / "RESULTS.add.md"
    with pytest.raises(SystemExit):
        gpu_quick.main(["--dry-run", "--out", str(tmp_path), "--runs", "1", "--new-tokens", "2",
                        "--record", str(record)])
    assert "decode synthetic tiny INT4" in record.read_text()


def test_offload_placements_join_flags_and_judge_the_expert_cache(monkeypatch):
    """bench/offload.py: '+' joins flags of one placement, and a budget measured with and
    without the expert cache is judged against issue 30's 1.25x."""
    offload = bench_module("offload", monkeypatch)
    rows = offload.placements("gpu-memory=24GiB,gpu-memory=24GiB+moe-cache=0,cpu-moe")
    assert rows == [("gpu-memory=24GiB", ("--gpu-memory", "24GiB")),
                    ("gpu-memory=24GiB+moe-cache=0", ("--gpu-memory", "24GiB", "--moe-cache", "0")),
                    ("cpu-moe", ("--cpu-moe",))]
    rates = {"gpu-memory=24GiB": 12.0, "gpu-memory=24GiB+moe-cache=0": 10.0, "cpu-moe": 5.0}
    verdicts = offload.goals({"placements": {n: {"decode_tok_s": {1: r}} for n, r in rates.items()}})
    assert verdicts == {"--gpu-memory 24GiB decode >= 1.25x with --moe-cache 0": False,
                        "--gpu-memory 24GiB decode >= 2x --cpu-moe": True}


def bench_module(name: str, monkeypatch):
    """bench/NAME.py imported. The scripts put bench/ first on sys.path, where
    a module there can shadow a package that later tests import: undone after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_served_decode_rate_counts_the_window_where_every_stream_decodes(monkeypatch):
    serve_streams = bench_module("serve_streams", monkeypatch)
    ticks = lambda first, last: [(float(t), 1) for t in range(first, last + 1)]  # noqa: E731
    assert serve_streams.steady_rate([ticks(0, 10)]) == 1.0    # one stream: first to last token
    # B starts at 3 s, A ends at 10 s: 7 tokens each in (3, 10], not A's lone start and B's tail
    assert serve_streams.steady_rate([ticks(0, 10), ticks(3, 13)]) == 14 / 7
    # never together: tokens after each stream's first over first to last of any
    assert serve_streams.steady_rate([ticks(0, 2), ticks(5, 7)]) == 4 / 7


def test_gpu_quick_decodes_without_the_fla_prefill_kernel(monkeypatch, tmp_path):
    """quick's prompts prefill through KDA's reference, whatever the device's default: on a
    GPU that is fla-core's chunk_kda, which autotunes on first call (the prefill section
    measures it). Here the environment asks for fla, which refuses the CPU: the decode still
    runs."""
    gpu_quick = bench_module("gpu_quick", monkeypatch)
    monkeypatch.setenv("KIMI_KERNELS", "kda_prefill=fla")
    for phase in ("measure_profile", "measure_verify"):  # the decode is what is asked
        monkeypatch.setattr(gpu_quick, phase, lambda *args: [])
    assert gpu_quick.main(["--dry-run", "--out", str(tmp_path), "--runs", "1",
                           "--new-tokens", "2"]) == 0
    quick = json.loads((tmp_path / "quick.json").read_text())
    assert quick["errors"] == {} and quick["decode"]["tok_s"] > 0


def test_gpu_quick_counts_kernels_and_merges_their_intervals(monkeypatch):
    gpu_quick = bench_module("gpu_quick", monkeypatch)
    spans = [("gemv", 0.0, 10.0), ("kda", 5.0, 15.0), ("Memcpy HtoD (Pageable -> Device)", 20.0, 22.0),
             ("gemv", 30.0, 40.0), ("gemv", 32.0, 34.0)]          # us; the last inside the one before
    summary = gpu_quick.gpu_summary(spans)
    assert summary["kernels"] == 4 and summary["copies"] == 1
    assert summary["busy_ms"] == (15 + 2 + 10) / 1e3 and summary["span_ms"] == 40 / 1e3
    assert summary["top"][0] == {"name": "gemv", "count": 3, "total_us": 22.0}
    assert [row["name"] for row in summary["top"]] == ["gemv", "kda", "Memcpy HtoD (Pageable -> Device)"]
    assert gpu_quick.gpu_summary([])["busy_ms"] == 0


def test_an_engine_stops_with_its_bench_script_when_a_time_limit_ends_it(tmp_path):
    """serve_streams.py's engine runs in its own process group, named in KIMI_BENCH_PIDS
    while it runs; SIGTERM to the script (a section's `timeout`) ends that whole group."""
    out, pids = tmp_path / "out", tmp_path / "pids"
    pids.mkdir()
    bench = subprocess.Popen(
        [sys.executable, str(BENCH / "serve_streams.py"), "--model", "synthetic:tiny",
         "--device", "cpu", "--threads", "1", "--streams", "1", "--new-tokens", "900",
         "--runs", "50", "--prefill", "512", "--max-context", "1000", "--bandwidth-mib", "8",
         "--out", str(out)], cwd=ROOT, env={**os.environ, "KIMI_BENCH_PIDS": str(pids)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert eventually(lambda: (out / "serve.json").exists()
                          and "graphs" in json.loads((out / "serve.json").read_text() or "{}"),
                          timeout=120), "the engine never started"
        (pidfile,) = pids.iterdir()
        group = int(pidfile.name)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 143, bench.stderr.read()[-2000:]
    finally:
        bench.kill()
        for left in pids.iterdir():  # a failed check leaves no engine behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(left.name), signal.SIGKILL)
    assert not pidfile.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    assert "kimi-engine: serving synthetic:tiny" in (out / "serve-engine.log").read_text()


def test_gpu_memory_sampler_has_a_sample_as_soon_as_it_starts(tmp_path, monkeypatch):
    """serve records the peak at start right after start_for: it read 0 before the sampling
    thread's first wait of 0.5 s ended."""
    fake_nvidia_smi(tmp_path, monkeypatch)
    served = bench_module("served", monkeypatch)
    sampler = served.GpuMemorySampler.start_for(SimpleNamespace(proc=SimpleNamespace(pid=4242)))
    try:
        assert sampler.peak()["bytes"] == 70000 << 20
    finally:
        sampler.result()


def fake_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\ncase "$1" in\n'
                    '  --query-compute-apps*) printf "17, 500\\n4242, 70000\\n" ;;\n'
                    '  *) echo 90000 ;;\nesac\n')  # MiB: two processes' rows, then the GPU's
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_gpu_memory_sampler_prefers_the_engine_process_row(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch)
    served = bench_module("served", monkeypatch)
    engine_row, no_row = served.GpuMemorySampler(4242), served.GpuMemorySampler(99)
    for sampler in (engine_row, no_row):
        sampler.sample()
    assert engine_row.result()["bytes"] == 70000 << 20
    assert "engine process" in engine_row.result()["source"]
    assert no_row.result()["bytes"] == 90000 << 20 and "whole GPU" in no_row.result()["source"]


def test_makefile_helper_check_runs():
    make = (ROOT / "Makefile").read_text()
    check = re.search(r"helper \"\$\(PY\) -c '([^']+)'\"", make).group(1)
    out = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def chat_through_proxy(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({
            "model": "kimi-local", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}]}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return {"status": resp.status, "body": json.loads(resp.read())}
    finally:
        conn.close()


def proxy_health(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def test_make_run_launcher_serves_on_a_temporary_socket(kimi_cache):
    """tools/run.py (what `make run` starts) brings up the engine on its default socket
    (here under a temporary XDG_RUNTIME_DIR) and the proxy in front of it."""
    runtime, port = short_tmpdir(), free_port()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "KIMI_RUN_PORT": str(port),
           "XDG_CACHE_HOME": str(kimi_cache)}
    env.pop("RUNTIME_DIRECTORY", None)
    log = open(runtime / "run.log", "w")  # a file, not a pipe nobody drains
    launcher = subprocess.Popen([sys.executable, str(ROOT / "tools" / "run.py")], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        assert eventually(lambda: (runtime / "kimi" / "engine.sock").exists()
                          and proxy_health(port), timeout=300), "launcher never served"
        reply = chat_through_proxy(port)
        assert reply["status"] == 200, reply
        assert reply["body"]["choices"][0]["message"]["content"]
    finally:
        launcher.send_signal(signal.SIGTERM)
        rc = stop_process(launcher, timeout=60)
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)
    assert rc == 128 + signal.SIGTERM


def test_model_step_counts_kernels_and_ends_with_the_gate_lines():
    """`bench/model_step.py --count-kernels`: the table by layer and op, then the two lines the
    decode gate (issue 24) and the prefill gate (issue 29) read."""
    done = subprocess.run([sys.executable, str(BENCH / "model_step.py"), "--count-kernels"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    *table, decode, prefill = done.stdout.strip().splitlines()
    assert re.fullmatch(r"kernels per decode step: \d+", decode), decode
    assert re.fullmatch(r"kernels per prefill chunk per layer: \d+", prefill), prefill
    assert int(decode.rsplit(" ", 1)[1]) <= 600
    assert any(line.startswith("| 26 MLA | triton.") for line in table)
