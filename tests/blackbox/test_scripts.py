"""What the suite does not import must still run: the bench scripts, the Makefile's helper
check and `make run`'s launcher all name modules that can move (the GPU run script:
test_gpu_run_script.py)."""
import http.client
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.blackbox.service_helpers import ROOT, free_port
from tests.support.engine import eventually, short_tmpdir, stop_process

BENCH = ROOT / "bench"


SCRIPTS_WITH_HELP = sorted(p.name for p in BENCH.glob("*.py") if "argparse" in p.read_text())
IMPORT_ONLY = sorted(p.name for p in BENCH.glob("*.py") if p.name not in SCRIPTS_WITH_HELP)



def test_every_bench_script_is_either_run_or_imported():
    assert set(SCRIPTS_WITH_HELP) >= {"decode.py", "int4_kernels.py", "proxy_overhead.py",
                                      "agent_turns.py", "model_step.py", "edit_turns.py"}
    assert set(IMPORT_ONLY) == {"common.py", "kernel_count.py", "llamacpp_run.py", "served.py",
                                "llamacpp_native.py", "structured_set.py", "beside.py", "int4_moe.py",
                                "prefill_requests.py", "host_probe.py"}


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
