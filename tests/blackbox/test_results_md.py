"""bench/RESULTS.md and README.md's measured table are what bench/results_md.py generates from
the newest bench/results/*.json, so neither can disagree with the records or with the other;
bench/results/history.md, the hand-appended file they replaced, stays as it was."""
import hashlib
import importlib.util
import json

import pytest

from tests.blackbox.service_helpers import ROOT

BENCH = ROOT / "bench"
HISTORY_SHA256 = "bd4d7c450301bf4fbb47456708147b66f4e5059d7cc393db29248227e978f721"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


results_md = load("results_md")


def record(hardware="AMD EPYC, 2 cores, 24 GiB", commit=None, report=True, **data) -> dict:
    data = {"hardware": hardware, "command": "bench/decode.py", **data}
    if commit:
        data["commit"] = commit
    if report:
        data["report"] = {"title": "Decode", "command": "bench/decode.py --skip transformers",
                          "lines": ["| runtime | decode tok/s |", "|---|---:|", "| engine | 1.0 |"]}
    return data


def decode(engine: float, llamacpp: float | None, server: float | None, **more) -> dict:
    runs = {"engine": {"decode_tok_s": engine, "prefill_tok_s": 4 * engine}}
    if llamacpp:
        runs["llamacpp"] = {"decode_tok_s": llamacpp, "prefill_tok_s": 2 * llamacpp}
    if server:
        runs["llamacpp-server"] = {"decode_tok_s": server, "prefill_tok_s": server}
    return record(**runs, **more)


def write(folder, files: dict):
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    return results_md.load_results(folder)


def test_results_md_and_readme_are_generated_from_the_newest_records():
    stale = [path.relative_to(ROOT).as_posix()
             for path, text in results_md.expected(BENCH / "results", ROOT).items()
             if path.read_text() != text]
    assert stale == [], "stale; run: .venv/bin/python bench/results_md.py"


def test_history_is_the_hand_appended_file_unchanged():
    digest = hashlib.sha256((BENCH / "results" / "history.md").read_bytes()).hexdigest()
    assert digest == HISTORY_SHA256


def test_each_benchmark_shows_its_newest_record_and_counts_the_older(tmp_path):
    results = write(tmp_path, {
        "decode-2026-12-03.json": record(commit="aaa1111"),
        "decode-2026-12-03-2.json": record(commit="bbb2222"),
        "decode-2026-12-04.json": record(commit="ccc3333", date="2026-12-05"),
        "proxy_overhead-2026-12-02.json": record(report=False, rows=[1, 2], loadavg_1min=1.23456,
                                                 throughput={"req_s": 795.0, "errors": 0})})
    text = results_md.results_md(results)
    decode_part, proxy_part = text.split("## Decode")[1].split("## proxy_overhead")
    assert "- date: 2026-12-05; commit: ccc3333" in decode_part   # the record's date wins
    assert "aaa1111" not in text and "bbb2222" not in text
    assert "2 earlier runs in `results/decode-*.json`" in decode_part
    assert "- command: `bench/decode.py --skip transformers`" in decode_part
    assert "| engine | 1.0 |" in decode_part
    assert "(no report recorded: its numbers)" in proxy_part
    assert "commit: not recorded" in proxy_part and "no earlier run recorded as JSON" in proxy_part
    assert "- loadavg_1min: 1.235\n- throughput.req_s: 795\n- throughput.errors: 0\n" in proxy_part
    assert "rows" not in proxy_part.split("- record:")[1]


def test_readme_table_is_the_newest_native_runs_beside_llama_server_and_llama_bench(tmp_path):
    native = {"decode_tok_s": 100.0, "prefill_tok_s": 300.0,
              "llama_bench": {"tg_tok_s": 120.0, "pp_tok_s": 400.0}}
    results = write(tmp_path, {
        "decode-2026-12-02.json": {**decode(99.0, 10.0, 10.0), "llama-server": native},
        "decode-2026-12-03.json": {**decode(150.0, 50.0, None), "llama-server": native,
                                   "commit": "ccc3333"},
        "decode-2026-12-04.json": decode(200.0, 100.0, 100.0),  # no native run: not in the README
        "decode_context-2026-12-04.json": {**decode(60.0, 40.0, 30.0, context=4000),
                                           "llama-server": {"decode_tok_s": 40.0, "prefill_tok_s": 1.0}}})
    table = results_md.readme_table(results)
    assert "native `llama-server`" in table[0] and "`llama-bench`" in table[0]
    assert table[2] == ("| AMD EPYC, 2 cores, 24 GiB, 2026-12-03, ccc3333 | decode, 64 tokens | "
                        "150.0 tok/s | 100.0 (1.50x) | 120.0 (1.25x) |")
    assert table[3] == "| | prefill, 512 tokens | 600 tok/s | 300 (2.00x) | 400 (1.50x) |"
    assert table[4] == ("| AMD EPYC, 2 cores, 24 GiB, 2026-12-04, not recorded | decode after a "
                        "4,000-token prompt (`--context 4000`) | 60.0 tok/s | 40.0 (1.50x) | "
                        "not measured |")
    assert "decode-2026-12-03.json" in table[-1] and "decode_context-2026-12-04.json" in table[-1]


def test_readme_table_without_a_native_run_says_so(tmp_path):
    table = results_md.readme_table(write(tmp_path, {"decode-2026-12-04.json": decode(200.0, 1.0, 1.0)}))
    assert table[2:] == ["", "*No run with native llama.cpp yet; every table: `bench/RESULTS.md`.*"]


def test_only_the_region_between_the_readme_markers_is_replaced():
    begin, end = results_md.README_BEGIN, results_md.README_END
    readme = f"# kimi\n\nabove\n{begin}\nold table\n{end}\nbelow\n"
    assert results_md.with_readme_table(readme, ["| new |"]) == \
        f"# kimi\n\nabove\n{begin}\n| new |\n{end}\nbelow\n"
    with pytest.raises(SystemExit, match="markers"):
        results_md.with_readme_table("# kimi without markers\n", ["| new |"])


def test_a_record_carries_hardware_date_commit_and_its_lines(tmp_path):
    common = load("common")
    path = common.record("decode", {"engine": {"decode_tok_s": 1.0}}, "Decode", " bench/decode.py ",
                         ["| a |", "|---|", "| 1 |", "\nA note."], folder=tmp_path)
    data = json.loads(path.read_text())
    assert path.parent == tmp_path and data["hardware"] == common.hardware()
    assert data["date"] == common.today() and data["commit"]
    assert data["report"] == {"title": "Decode", "command": "bench/decode.py",
                              "lines": ["| a |", "|---|", "| 1 |", "", "A note."]}


def test_a_gpu_scripts_record_line_joins_its_summary(tmp_path):
    common, out = load("common"), tmp_path / "RESULTS.add.md"
    common.record_line(out, ["served 1.0 tok/s:", "  1 stream 1.0", "  8 streams 2.0"], "python s.py")
    common.record_line(out, ["decode 5.0 tok/s"], "python bench/gpu_quick.py")
    day = common.today()
    assert out.read_text().splitlines() == [
        f"- {day} served 1.0 tok/s: 1 stream 1.0; 8 streams 2.0 (`python s.py`)",
        f"- {day} decode 5.0 tok/s (`python bench/gpu_quick.py`)"]


def test_the_commit_ignores_records_and_generated_tables_but_not_code(tmp_path):
    """A second run, its first one's records not yet committed, measured HEAD all the same."""
    import shutil
    import subprocess
    repo = tmp_path / "repo"
    (repo / "bench" / "results").mkdir(parents=True)
    shutil.copy(BENCH / "common.py", repo / "bench" / "common.py")
    for name in ("README.md", "bench/RESULTS.md", "bench/results/decode-1.json", "bench/decode.py"):
        (repo / name).write_text("before\n")

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                       check=True, capture_output=True)
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    spec = importlib.util.spec_from_file_location("bench_common_copy", repo / "bench" / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    for name in ("README.md", "bench/RESULTS.md", "bench/results/decode-1.json"):
        (repo / name).write_text("after\n")
    assert not common.commit().endswith("+ changes")
    (repo / "bench" / "decode.py").write_text("after\n")
    assert common.commit().endswith(" + changes")
