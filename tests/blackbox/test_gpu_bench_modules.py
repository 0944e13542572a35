"""The GPU run's bench modules (bench/offload.py, serve_streams.py, gpu_quick.py, served.py)
when a section is cut short, a placement fails or a step fails to capture: what they record,
and that no engine outlives its script."""
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.blackbox.service_helpers import ROOT
from tests.support.engine import eventually

BENCH = ROOT / "bench"


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
    """bench/offload.py: '+' joins flags of one placement, and issue 30's goals: a budget with
    the expert cache >= 1.25x without it, >= 2.5x --cpu-moe (its row named cpu-moe with or
    without more flags), its peak within the budget, --cpu-moe >= 60% of its RAM cap."""
    offload = bench_module("offload", monkeypatch)
    rows = offload.placements("gpu-memory=24GiB,gpu-memory=24GiB+moe-cache=0,cpu-moe")
    assert rows == [("gpu-memory=24GiB", ("--gpu-memory", "24GiB")),
                    ("gpu-memory=24GiB+moe-cache=0", ("--gpu-memory", "24GiB", "--moe-cache", "0")),
                    ("cpu-moe", ("--cpu-moe",))]
    rates = {"gpu-memory=24GiB": 12.0, "gpu-memory=24GiB+moe-cache=0": 10.0, "cpu-moe": 5.0}
    verdicts = offload.goals({"placements": {n: {"decode_tok_s": {1: r}} for n, r in rates.items()}})
    assert verdicts == {"--gpu-memory 24GiB decode >= 1.25x with --moe-cache 0": False,
                        "--gpu-memory 24GiB decode >= 2.5x --cpu-moe": False}
    placements = {"gpu-memory=24GiB": {"decode_tok_s": {1: 13.0}, "peak_memory": {"bytes": 25 << 30}},
                  "gpu-memory=24GiB+moe-cache=0": {"decode_tok_s": {1: 10.0}},
                  "cpu-moe+moe-cache=0": {"decode_tok_s": {1: 5.0}, "ram_cap": {"pct": 61.0}}}
    assert offload.goals({"placements": placements}) == {
        "--cpu-moe decode >= 60% of the RAM-bandwidth cap": True,
        "--gpu-memory 24GiB decode >= 1.25x with --moe-cache 0": True,
        "--gpu-memory 24GiB decode >= 2.5x --cpu-moe": True,
        "--gpu-memory 24GiB peak <= 24GiB": False}
    log = ("kimi-engine:   routed experts of 6 of 26 MoE layers in RAM (layers 1..6)\n"
           "kimi-engine:   expert cache: 167 experts, 634.1 MiB (--moe-cache)\n"
           "kimi-engine: the routed experts in RAM (6 of 26 MoE layers) follow the route trace "
           "t.json.gz (3 MoE layers x 8 experts, top-2, 2112 positions; spread to 256 experts, "
           "top-8); the other layers follow their routers\n")
    place = offload.placement_of(log)
    assert place["layers_in_ram"] == 6 and place["is_following"] and len(place["lines"]) == 3
    lookups = 'kimi_engine_moe_cache_lookups_total{layer="%d",result="%s"}'
    counted = offload.offload_counts({lookups % (1, "hit"): 3.0, lookups % (2, "hit"): 3.0,
                                      lookups % (1, "miss"): 2.0})
    assert (counted["cache_hits"], counted["cache_misses"]) == (6.0, 2.0)
    assert "expert cache hits 75% of 8" in offload.steps_text(counted)


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


def test_the_stream_beside_a_prefill_times_its_steps_when_tokens_come_in_chunks(monkeypatch):
    """A loaded engine sends several tokens in one chunk when its HTTP thread fell behind: a
    token's step is its share of its chunk's gap (raw gaps, mostly 0, divided by zero in a
    loaded dry run and lost the measurement), for the lone steps and the slowest alike, so a
    steady stream in chunks of 3 is judged steady; the lone steps are those before the prefill
    was sent; a token a chunk gives the plain gaps."""
    monkeypatch.syspath_prepend(str(BENCH))  # its `from common import ...`, as the scripts run it
    beside = bench_module("beside", monkeypatch)
    n = beside.LONE_TOKENS
    one_a_chunk = [(0.010 * i, 1) for i in range(n)] + [(0.5, 1), (0.51, 1)]
    row = beside.step_times(one_a_chunk, sent=0.35, answered=0.45)
    assert row["lone_step_s"] == pytest.approx(0.010)
    assert row["slowest_step_s"] == pytest.approx(0.5 - 0.010 * (n - 1))  # the stall
    assert row["slowest_x_lone"] == pytest.approx(row["slowest_step_s"] / 0.010)
    assert row["tokens_during_prefill"] == 0 and row["outlived_prefill"]
    three_a_chunk = [(0.030 * i, 3) for i in range(16)]  # 0 .. 0.45 s, steady
    row = beside.step_times(three_a_chunk, sent=0.2, answered=0.4)
    assert row["lone_step_s"] == pytest.approx(0.010) and row["slowest_x_lone"] == pytest.approx(1)
    assert row["tokens_during_prefill"] == 3 * 7 and row["outlived_prefill"]
    slower_beside = [(0.0, 22)] + [(0.010 * i, 1) for i in range(1, 11)] + [
        (0.10 + 0.050 * i, 1) for i in range(1, 23)]  # 10 lone steps, then 22 of 50 ms
    row = beside.step_times(slower_beside, sent=0.105, answered=0.9)
    assert row["lone_step_s"] == pytest.approx(0.010)  # not the steps beside the prefill
    assert row["slowest_x_lone"] == pytest.approx(5) and row["outlived_prefill"]
    with pytest.raises(RuntimeError, match="in one chunk"):
        beside.step_times([(0.1, n + 9)], sent=0.2, answered=0.3)


def test_the_stream_beside_a_prefill_outlives_a_slow_admission(monkeypatch):
    """The stream spares SLACK_TOKENS steps beyond a token per prefill chunk for the prefill's
    request to arrive (with 32, a loaded fresh clone's dry run saw the stream end first), and
    context_room reserves all of its tokens against --max-context."""
    monkeypatch.syspath_prepend(str(BENCH))
    beside = bench_module("beside", monkeypatch)
    for tokens in (256, 32768):
        spare = beside.stream_tokens(tokens) - beside.LONE_TOKENS - beside.AFTER_TOKENS
        assert spare - tokens // beside.MIN_CHUNK >= 256
        assert beside.context_room(tokens) > beside.stream_tokens(tokens)


class _Lines(list):
    """A streamed HTTP reply: status 200, its lines."""
    status = 200


def test_serve_streams_judges_decode_at_a_32k_context_against_one_short_stream(monkeypatch):
    """Issue 24: decode at a 32k context >= 50% of one stream's rate, from the longest
    prefill's own stream: its TTFT is the first token's arrival, its rate the tokens after
    that chunk over the time from it to the last; the prompt tokens from the usage chunk."""
    serve_streams = bench_module("serve_streams", monkeypatch)
    requests = bench_module("prefill_requests", monkeypatch)
    events = [([7], 1.0), ([1, 2], 1.5), ([3], 2.0), ([4, 5, 6], 3.0)]
    lines = [b"data: " + json.dumps({"choices": [{"text": "x", "token_ids": ids}]}).encode()
             for ids, _ in events]
    lines += [b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 32768}}).encode(),
              b"data: [DONE]"]
    clock = iter([0.0] + [at for _, at in events])
    monkeypatch.setattr(requests.time, "perf_counter", lambda: next(clock))
    sent = []

    def post(sock, path, body):
        sent.append(body)
        return SimpleNamespace(close=lambda: None), _Lines(lines)

    monkeypatch.setattr(sys.modules[requests.token_chunks.__module__], "unix_post", post)
    ttft, counted, rate = requests.ttft_then_decode(SimpleNamespace(sock="s"), 32768, 1, 6)
    assert (ttft, counted, rate) == (1.0, 32768, 6 / 2.0)
    assert sent[0]["max_tokens"] == 7 and sent[0]["speculative"] is False
    assert sent[0]["stream_options"] == {"include_usage": True}
    goal = "decode at a 32k context >= 50% of one short stream's"
    for depth, met in ((50.0, True), (49.0, False)):
        r = {"decode_tok_s": {1: 100.0}, "decode_at_depth": {"context": 32768, "tok_s": depth}}
        assert serve_streams.goals(r)[goal] is met
    short = {"decode_tok_s": {1: 100.0}, "decode_at_depth": {"context": 8192, "tok_s": 10.0}}
    assert goal not in serve_streams.goals(short)
    lines = serve_streams.summary({"model": "m", "device": "cpu", **short})
    assert "  decode at a 8192-token context: 10.0 tok/s, 0.10x one short stream" in lines
