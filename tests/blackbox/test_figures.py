"""bench/figures.py (`make figures`): the tables each figure is drawn from, on synthetic results
shaped like bench/results/*.json and on the real newest files; drawing only where matplotlib
(a bench-only dependency) is installed."""
import importlib.util
import json
import subprocess
import sys

import pytest

from tests.blackbox.service_helpers import ROOT

BENCH = ROOT / "bench"
XEON, EPYC = "Intel(R) Xeon(R) Processor, 2 cores, 24 GiB", "AMD EPYC, 2 cores, 24 GiB"


def load_figures():
    spec = importlib.util.spec_from_file_location("bench_figures", BENCH / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = load_figures()


def decode(hardware, llamacpp=True) -> dict:
    data = {"hardware": hardware,
            "engine": {"decode_tok_s": 54.0, "prefill_tok_s": 680.0, "peak_rss_mb": 533.0},
            "transformers": {"decode_tok_s": 27.0, "prefill_tok_s": 740.0}}
    if llamacpp:
        data["llamacpp"] = {"decode_tok_s": 90.0, "prefill_tok_s": 340.0}
    return data


def gemv_row(shape, variant, gbs, probe) -> dict:
    return {"shape": shape, "op": "w4a16_gemv", "variant": variant, "n": 576, "k": 576,
            "bytes": 207360, "us_cold": 31.0, "us_hot": 26.0, "gbs_cold": gbs, "gbs_hot": gbs * 2,
            "probe_gbs": probe, "pct_of_probe": 100 * gbs / probe, "loadavg_1min": 1.2}


GEMV = {"hardware": XEON, "command": "python bench/kernels.py ", "device": "cpu", "threads": 2,
        "rows": [gemv_row("q/o", "cpu_c", 6.0, 30.0), gemv_row("q/o", "torch fp32 matmul", 24.0, 30.0),
                 gemv_row("experts w2", "cpu_c", 15.0, 31.0)]}
AGENT = {"hardware": XEON,
         "cache off": [{"turn": 1, "ttft_s": 20.0, "prompt_tokens": 5696, "hit_tokens": 0.0},
                       {"turn": 2, "ttft_s": 22.0, "prompt_tokens": 5779, "hit_tokens": 0.0}],
         "cache on": [{"turn": 1, "ttft_s": 16.0, "prompt_tokens": 5696, "hit_tokens": 0.0},
                      {"turn": 2, "ttft_s": 0.5, "prompt_tokens": 5779, "hit_tokens": 5696.0}],
         "decode": {"1": 27.7}, "decode_max_batch_1": {"4": 24.8}}
PROXY = {"hardware": XEON, "rows": [["chat non-stream", 0.236, 1.130, 0.894, 1.732],
                                    ["chat stream TTFB", 0.259, 1.032, 0.773, 1.054]]}


def write(folder, files: dict):
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    return figures.load_results(folder)


def charts_by_name(results) -> dict:
    charts, _ = figures.plan(results)
    return {c["name"]: c for c in charts}


def test_newest_run_orders_by_date_then_numeric_suffix(tmp_path):
    results = write(tmp_path, {"decode-2026-12-03-10.json": {}, "decode-2026-12-03-2.json": {},
                               "decode-2026-12-03.json": {}, "decode-2026-12-02-3.json": {},
                               "notes.json": {}})
    assert [(r.date, r.run) for r in results] == [("2026-12-02", 3), ("2026-12-03", 1),
                                                  ("2026-12-03", 2), ("2026-12-03", 10)]


def test_decode_against_llamacpp_labels_each_bar_with_its_ratio(tmp_path):
    chart = charts_by_name(write(tmp_path, {"decode-2026-12-02.json": decode(XEON)}))["decode"]
    decode_panel, prefill_panel = chart["panels"]
    assert decode_panel["series"] == {"kimi-local": [54.0], "llama.cpp": [90.0],
                                      "transformers fp32": [27.0]}
    assert decode_panel["labels"]["kimi-local"] == ["54.0\n0.60x llama.cpp"]
    assert decode_panel["labels"]["llama.cpp"] == ["90.0"]
    assert prefill_panel["labels"]["kimi-local"] == ["680.0\n2.00x llama.cpp"]
    assert chart["note"] is None
    assert f"{XEON}, 2026-12-02" in chart["title"]
    assert "decode-2026-12-02.json" in chart["footnote"] and "bench/decode.py" in chart["footnote"]


def test_decode_ratios_are_to_native_llama_server_where_it_ran(tmp_path):
    native = {**decode(EPYC), "llama-server": {"decode_tok_s": 60.0, "prefill_tok_s": 400.0}}
    results = write(tmp_path, {"decode-2026-12-02.json": decode(XEON),
                               "decode-2026-12-04.json": native})
    decode_panel, prefill_panel = charts_by_name(results)["decode"]["panels"]
    assert decode_panel["labels"]["kimi-local"] == ["54.0\n0.90x llama-server"]
    assert decode_panel["labels"]["llama-server"] == ["60.0"]
    assert decode_panel["labels"]["llama.cpp"] == ["90.0\n1.50x llama-server"]
    assert prefill_panel["labels"]["kimi-local"] == ["680.0\n1.70x llama-server"]


def test_decode_shows_the_newest_run_with_llamacpp_and_says_the_newest_lacks_it(tmp_path):
    results = write(tmp_path, {"decode-2026-12-02.json": decode(XEON),
                               "decode-2026-12-04.json": decode(EPYC, llamacpp=False)})
    chart = charts_by_name(results)["decode"]
    assert "2026-12-02" in chart["title"] and XEON in chart["footnote"]
    assert figures.NOT_MEASURED in chart["note"]
    assert "2026-12-04" in chart["note"] and EPYC in chart["note"]


def test_decode_without_any_llamacpp_run_is_drawn_and_says_not_measured(tmp_path):
    chart = charts_by_name(write(tmp_path, {"decode-2026-12-04.json": decode(EPYC, False)}))["decode"]
    assert chart["note"] == figures.NOT_MEASURED
    assert chart["panels"][0]["series"] == {"kimi-local": [54.0], "transformers fp32": [27.0]}
    assert chart["panels"][0]["labels"]["kimi-local"] == ["54.0"]


def test_kernels_bars_per_shape_and_variant_beside_the_probe(tmp_path):
    older = {**GEMV, "rows": [gemv_row("q/o", "cpu_c", 1.0, 30.0)]}
    chart = charts_by_name(write(tmp_path, {"gemv-cpu-2026-12-01.json": older,
                                            "gemv-cpu-2026-12-02.json": GEMV}))["kernels-cpu"]
    (p,) = chart["panels"]
    assert p["groups"] == ["q/o", "experts w2"]
    assert p["series"] == {"cpu_c": [6.0, 15.0], "torch fp32 matmul": [24.0, None]}
    assert p["labels"]["cpu_c"] == ["20%", "48%"] and p["labels"]["torch fp32 matmul"][1] == ""
    assert p["reference"] == ("read probe GB/s", [30.0, 31.0])
    assert "cpu, 2 threads" in chart["title"] and "python bench/kernels.py`" in chart["footnote"]


def test_agent_turns_and_proxy_tables(tmp_path):
    charts = charts_by_name(write(tmp_path, {"agent_turns-2026-12-02.json": AGENT,
                                             "proxy_overhead-2026-12-02.json": PROXY}))
    (agent,) = charts["agent_turns"]["panels"]
    assert agent["series"] == {"prefix cache off": [20.0, 22.0], "prefix cache on": [16.0, 0.5]}
    assert agent["labels"]["prefix cache on"] == ["16.00\n1.2x", "0.50\n44.0x"]
    assert agent["groups"][1] == "turn 2\n5779 tok" and agent["log"]
    (proxy,) = charts["proxy_overhead"]["panels"]
    assert proxy["groups"] == ["chat non-stream", "chat stream TTFB"]
    assert proxy["series"] == {"added p50": [0.894, 0.773], "added p99": [1.732, 1.054]}
    assert proxy["reference"] == ("direct request p50", [0.236, 0.259])
    assert XEON in charts["proxy_overhead"]["title"] and charts["proxy_overhead"]["note"] is None


def test_proxy_from_the_dict_rows_and_throughput_the_script_writes(tmp_path):
    """bench/proxy_overhead.py writes rows as dicts and its throughput run; p99 is optional."""
    rows = [{"case": "chat non-stream", "direct_p50_ms": 0.4, "proxied_p50_ms": 1.5,
             "added_p50_ms": 1.1},
            {"case": "anthropic stream TTFB", "direct_p50_ms": 0.42, "proxied_p50_ms": 1.3,
             "added_p50_ms": 0.86}]
    data = {"hardware": EPYC, "command": "bench/proxy_overhead.py", "rows": rows,
            "throughput": {"clients": 64, "seconds": 10.0, "req_s": 795.3, "errors": 0}}
    chart = charts_by_name(write(tmp_path, {"proxy_overhead-2026-12-03.json": data}))[
        "proxy_overhead"]
    (proxy,) = chart["panels"]
    assert proxy["series"] == {"added p50": [1.1, 0.86]}
    assert proxy["labels"]["added p50"] == ["1.10", "0.86"]
    assert proxy["reference"] == ("direct request p50", [0.4, 0.42])
    assert chart["note"] == "throughput through the proxy: 795 req/s, 64 keep-alive clients, 0 errors"
    assert chart["footnote"].startswith(f"{EPYC}, 2026-12-03; `bench/proxy_overhead.py`")


def test_a_kind_without_results_is_skipped_with_a_message(tmp_path):
    charts, skipped = figures.plan(write(tmp_path, {"agent_turns-2026-12-02.json": AGENT}))
    assert [c["name"] for c in charts] == ["agent_turns"]
    assert len(skipped) == 3 and any("proxy_overhead-*.json" in s for s in skipped)


def test_the_real_newest_results_and_no_matplotlib_needed():
    """Extraction on bench/results as committed, in a process that must never import
    matplotlib; each chart names the hardware of the file it was drawn from."""
    code = ("import json, sys; sys.path.insert(0, 'bench'); import figures; "
            "charts, _ = figures.plan(figures.load_results(figures.BENCH / 'results')); "
            "assert 'matplotlib' not in sys.modules; print(json.dumps(charts))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    runs = [r for r in figures.load_results(BENCH / "results") if r.kind == "decode"]
    for chart in json.loads(out.stdout):
        name = chart["footnote"].rsplit("; ", 1)[1]
        data = json.loads((BENCH / "results" / name).read_text())
        assert chart["footnote"].startswith(data["hardware"]) and data["hardware"] in chart["title"]
        if chart["name"] == "decode":
            engine = data["engine"]["decode_tok_s"]
            assert chart["panels"][0]["series"]["kimi-local"] == [engine]
            baselines = [r for r in runs if r.data.get("llama-server") or r.data.get("llamacpp")]
            assert name == (baselines or runs)[-1].path.name


def test_drawing_writes_png_and_pdf_the_same_each_time(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is bench-only: `make figures` installs it")
    charts = charts_by_name(write(tmp_path, {"decode-2026-12-04.json": decode(EPYC, False),
                                             "gemv-cpu-2026-12-02.json": GEMV}))
    first = [p.read_bytes() for c in charts.values() for p in figures.draw(c, tmp_path / "a")]
    again = [p.read_bytes() for c in charts.values() for p in figures.draw(c, tmp_path / "b")]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "decode.pdf", "decode.png", "kernels-cpu.pdf", "kernels-cpu.png"]
    assert all(first) and first == again
