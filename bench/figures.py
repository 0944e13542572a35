"""make figures: PNG and PDF figures in docs/figures/ from the measured numbers in bench/results.

    .venv/bin/python bench/figures.py [--results bench/results] [--out docs/figures]

Each figure reads the newest results file of its kind (NAME-DATE.json, then NAME-DATE-2.json,
...) and names its hardware, date, command and file; a kind with no file is skipped with a
message, never drawn from other numbers. Decode and prefill against llama.cpp come from the
newest decode file that measured llama.cpp, and the figure says so when the newest one did not.

Extraction (results JSON -> charts: plain dicts of groups, series and bar labels) needs no
matplotlib, so the tests run without it; only drawing imports it (a bench-only dependency,
which `make figures` installs). Files carry no timestamps, so a re-run does not churn git.
"""
import argparse
import dataclasses
import json
import pathlib
import re

BENCH = pathlib.Path(__file__).resolve().parent
FILE_NAME = re.compile(r"^(?P<kind>.+)-(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<run>\d+))?\.json$")
KERNEL_KINDS = re.compile(r"^(gemv|kernels)(-|$)")
RUNTIMES = {"engine": "kimi-local", "llama-server": "llama-server", "llamacpp": "llama.cpp",
            "llamacpp-server": "llama_cpp.server", "transformers": "transformers fp32"}
BASELINES = ("llama-server", "llamacpp")  # the ratios' reference: native llama-server where it ran
COMMANDS = {"decode": "make bench (bench/decode.py)", "agent_turns": "python bench/agent_turns.py",
            "proxy_overhead": "python bench/proxy_overhead.py"}
NOT_MEASURED = "llama.cpp not measured on this machine"
PROXY_COLUMNS = ("case", "direct_p50_ms", "proxied_p50_ms", "added_p50_ms", "added_p99_ms")


@dataclasses.dataclass(frozen=True)
class Result:
    path: pathlib.Path
    kind: str
    date: str
    run: int
    data: dict

    @property
    def hardware(self) -> str:
        return self.data.get("hardware") or "hardware not recorded"

    @property
    def command(self) -> str:
        fallback = "python bench/kernels.py" if KERNEL_KINDS.match(self.kind) else self.kind
        return (self.data.get("command") or "").strip() or COMMANDS.get(self.kind, fallback)

    def footnote(self) -> str:
        return f"{self.hardware}, {self.date}; `{self.command}`; {self.path.name}"


def parse_name(path: pathlib.Path) -> tuple[str, str, int] | None:
    """decode-2026-12-02-3.json -> ("decode", "2026-12-02", 3); the unsuffixed file is run 1."""
    m = FILE_NAME.match(path.name)
    return m and (m["kind"], m["date"], int(m["run"] or 1))


def load_results(folder: pathlib.Path) -> list[Result]:
    """Every NAME-DATE[-N].json in folder, oldest first."""
    found = []
    for path in pathlib.Path(folder).glob("*.json"):
        if parsed := parse_name(path):
            found.append(Result(path, *parsed, json.loads(path.read_text())))
    return sorted(found, key=lambda r: (r.date, r.run, r.kind))


def chart(name: str, title: str, shown: Result, panels: list[dict], note: str | None = None) -> dict:
    return dict(name=name, title=f"{title}\n{shown.hardware}, {shown.date}", note=note,
                footnote=shown.footnote(), panels=panels)


def panel(ylabel: str, groups: list[str], series: dict, labels: dict, reference=None,
          log: bool = False) -> dict:
    """Grouped bars: series name -> one value per group (None: not measured), the text above
    each bar, and an optional per-group horizontal line (name, one value per group)."""
    return dict(ylabel=ylabel, groups=groups, series=series, labels=labels, reference=reference,
                log=log)


def decode_chart(runs: list[Result]) -> dict:
    """Decode and prefill tok/s per runtime, each bar's ratio to llama.cpp printed on it: to
    native llama-server (served against served) where the run measured it, else to
    llama-cpp-python's in-process binding (earlier runs)."""
    newest = runs[-1]
    with_llama = [r for r in runs if any(r.data.get(b) for b in BASELINES)]
    shown = with_llama[-1] if with_llama else newest
    note = None
    if not with_llama:
        note = NOT_MEASURED
    elif shown is not newest:
        note = (f"newest decode run ({newest.date}, {newest.hardware}): {NOT_MEASURED}; "
                f"shown: the newest run with llama.cpp ({shown.date})")
    base = next((b for b in BASELINES if shown.data.get(b)), None)
    ref = shown.data.get(base) if base else None
    panels = []
    for key, what in (("decode_tok_s", "decode tok/s"), ("prefill_tok_s", "prefill tok/s")):
        series, labels = {}, {}
        for runtime, name in RUNTIMES.items():
            if not (numbers := shown.data.get(runtime)):
                continue
            value = numbers[key]
            series[name] = [value]
            ratio = f"\n{value / ref[key]:.2f}x {RUNTIMES[base]}" if ref and runtime != base else ""
            labels[name] = [f"{value:.1f}{ratio}"]
        panels.append(panel(what, [what.split()[0]], series, labels))
    return chart("decode", "Decode and prefill: kimi-local against llama.cpp", shown, panels, note)


def kernels_chart(result: Result) -> dict:
    """GB/s of every variant per shape (cold: weights read from memory), beside the read probe
    measured next to that shape; each bar labelled with its % of the probe."""
    rows = result.data["rows"]
    groups = list(dict.fromkeys(r["shape"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    by_key = {(r["shape"], r["variant"]): r for r in rows}
    series = {v: [by_key[g, v]["gbs_cold"] if (g, v) in by_key else None for g in groups]
              for v in variants}
    labels = {v: [f"{by_key[g, v]['pct_of_probe']:.0f}%" if (g, v) in by_key else "" for g in groups]
              for v in variants}
    probe = [next(r["probe_gbs"] for r in rows if r["shape"] == g) for g in groups]
    device = result.data.get("device") or result.kind.partition("-")[2] or "cpu"
    threads = result.data.get("threads")
    title = f"INT4 GEMV GB/s against the read-bandwidth probe, M=1, {device}" + (
        f", {threads} threads" if threads else "")
    name = "kernels-" + (result.kind.partition("-")[2] or device)
    return chart(name, title, result, [panel("GB/s (cold)", groups, series, labels,
                                             ("read probe GB/s", probe))])


def proxy_rows(data: dict) -> list[dict]:
    """The latency rows as bench/proxy_overhead.py builds them ([case, direct p50, proxied p50,
    added p50, added p99], ms) or as dicts with PROXY_COLUMNS keys."""
    return [row if isinstance(row, dict) else dict(zip(PROXY_COLUMNS, row)) for row in data["rows"]]


def proxy_chart(result: Result) -> dict:
    """Added p50 (and p99 where recorded) per route, beside the direct request's own p50; the
    throughput run, where recorded, in the note."""
    rows = proxy_rows(result.data)
    groups = [r["case"] for r in rows]
    series, labels = {}, {}
    for key, name in (("added_p50_ms", "added p50"), ("added_p99_ms", "added p99")):
        if any(r.get(key) is not None for r in rows):
            series[name] = [r.get(key) for r in rows]
            labels[name] = [f"{r[key]:.2f}" if r.get(key) is not None else "" for r in rows]
    t = result.data.get("throughput")
    note = t and (f"throughput through the proxy: {t['req_s']:.0f} req/s, {t['clients']} "
                  f"keep-alive clients, {t['errors']} errors")
    return chart("proxy_overhead", "Latency kimi-proxy adds over a direct request", result,
                 [panel("ms", groups, series, labels,
                        ("direct request p50", [r["direct_p50_ms"] for r in rows]))], note)


def agent_chart(result: Result) -> dict:
    """TTFT per agent turn with the prefix cache off and on; the on bars carry the speed-up."""
    off, on = result.data["cache off"], result.data["cache on"]
    groups = [f"turn {t['turn']}\n{t['prompt_tokens']} tok" for t in off]
    series = {"prefix cache off": [t["ttft_s"] for t in off],
              "prefix cache on": [t["ttft_s"] for t in on]}
    labels = {"prefix cache off": [f"{t['ttft_s']:.2f}" for t in off],
              "prefix cache on": [f"{b['ttft_s']:.2f}\n{a['ttft_s'] / b['ttft_s']:.1f}x"
                                  for a, b in zip(off, on)]}
    return chart("agent_turns", "Agent-turn TTFT with and without the prefix cache", result,
                 [panel("time to first token, s (log)", groups, series, labels, log=True)])


def plan(results: list[Result]) -> tuple[list[dict], list[str]]:
    """-> (charts to draw, a message per figure skipped for want of a results file)."""
    def of(kind: str) -> list[Result]:
        return [r for r in results if r.kind == kind]

    charts, skipped = [], []
    if runs := of("decode"):
        charts.append(decode_chart(runs))
    else:
        skipped.append("decode and prefill: no decode-*.json (bench/decode.py)")
    kernel_kinds = sorted({r.kind for r in results if KERNEL_KINDS.match(r.kind)})
    charts += [kernels_chart(of(kind)[-1]) for kind in kernel_kinds]
    if not kernel_kinds:
        skipped.append("kernel GB/s: no gemv-*.json or kernels*.json (bench/int4_kernels.py)")
    if runs := of("proxy_overhead"):
        charts.append(proxy_chart(runs[-1]))
    else:
        skipped.append("proxy added latency: no proxy_overhead-*.json (bench/proxy_overhead.py)")
    if runs := of("agent_turns"):
        charts.append(agent_chart(runs[-1]))
    else:
        skipped.append("agent-turn TTFT: no agent_turns-*.json (bench/agent_turns.py)")
    return charts, skipped


def draw(spec: dict, out: pathlib.Path) -> list[pathlib.Path]:
    """One chart -> out/NAME.png and out/NAME.pdf, without timestamps or version stamps."""
    from matplotlib.figure import Figure  # bench-only: see the module docstring

    panels = spec["panels"]
    widths = [max(3.2, 0.42 * len(p["groups"]) * len(p["series"]) + 1.6) for p in panels]
    fig = Figure(figsize=(max(7.0, sum(widths)), 5.2), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, width_ratios=widths)[0]
    for ax, p in zip(axes, panels):
        draw_panel(ax, p)
    fig.suptitle(spec["title"] + (f"\n{spec['note']}" if spec["note"] else ""), fontsize=10)
    fig.supxlabel(spec["footnote"], fontsize=7, color="0.35")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{spec['name']}.png", out / f"{spec['name']}.pdf"]
    fig.savefig(paths[0], dpi=120, metadata={"Software": None})
    fig.savefig(paths[1], metadata={"CreationDate": None, "Producer": None, "Creator": None})
    return paths


def draw_panel(ax, p: dict):
    groups, series = p["groups"], p["series"]
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, [v or 0 for v in values], width, label=name)
        ax.bar_label(bars, labels=p["labels"][name], fontsize=7, padding=2)
    if p["reference"]:
        name, values = p["reference"]
        for g, value in enumerate(values):
            ax.hlines(value, g - 0.45, g + 0.45, colors="black", linestyles="--",
                      label=name if g == 0 else None)
    if p["log"]:
        ax.set_yscale("log")
    ax.margins(y=0.25)
    ax.set_xticks(range(len(groups)), groups, fontsize=8, rotation=20 if len(groups) > 4 else 0,
                  ha="right" if len(groups) > 4 else "center")
    ax.set_ylabel(p["ylabel"])
    ax.legend(fontsize=7)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=BENCH / "results")
    parser.add_argument("--out", type=pathlib.Path, default=BENCH.parent / "docs" / "figures")
    args = parser.parse_args(argv)
    charts, skipped = plan(load_results(args.results))
    for message in skipped:
        print(f"skipped {message}")
    for spec in charts:
        print("wrote", " ".join(str(p) for p in draw(spec, args.out)), f"({spec['footnote']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
