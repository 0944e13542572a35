"""Shared bits for the benchmark scripts: hardware naming, results files, RESULTS.md rows."""
import datetime
import json
import os
import pathlib
import platform

BENCH = pathlib.Path(__file__).resolve().parent
RESULTS_MD = BENCH / "RESULTS.md"


def hardware() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {cores} cores, {mem_gib:.0f} GiB"


def today() -> str:
    return datetime.date.today().isoformat()


def write_json(name: str, payload: dict) -> pathlib.Path:
    out = BENCH / "results" / f"{name}-{today()}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    return out


def append_results(title: str, command: str, table_lines: list[str]):
    """Append one dated block to bench/RESULTS.md (never rewrites earlier rows)."""
    if not RESULTS_MD.exists():
        RESULTS_MD.write_text("# Benchmark results\n\nEvery block names its hardware, command and "
                              "date, and its baseline measured in the same run.\n")
    block = [f"\n## {title}, {today()}\n", f"- hardware: {hardware()}", f"- command: `{command}`", ""]
    with RESULTS_MD.open("a") as f:
        f.write("\n".join(block + table_lines) + "\n")
