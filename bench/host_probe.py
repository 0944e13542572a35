"""How busy the host is while a served benchmark runs, measured apart from the engines under
test: the default model's decode step in the bench's own process, one row and PROBE_ROWS rows
of one sequence PROBE_DEPTH positions deep, the two interleaved.

A one-row step streams the weights from memory; each further row adds compute (the W4A8
GEMM's dot products, attention, the row-wise work between them). On the 2-vCPU CI VMs the two
move apart: one night (2026-12-07 to 08) the extra row's cost went from ~140 us to ~390 us
within minutes while the one-row step stayed at 2.5-2.8 ms (a neighbour on the cores), and
hours later the one-row step rose to 7 ms. Speculative decoding's gain follows the row cost,
since a verifying step pays it for every draft (bench/edit_turns.py, which records these
probes beside its turns).

    host = HostProbe(threads=2)
    host.measure()  # -> {"one_row_ms": 2.31, "row_us": 214.0}
"""
import statistics
import time

PROBE_DEPTH = 300  # cached positions: an edit turn's depth (prompt ~200, reply up to 160)
PROBE_ROWS = 8  # a full verifying step: the input token and 7 drafts
PROBE_REPS = 40  # steps of each kind a probe times (~0.3 s)


def row_cost(one_row: list[float], many_rows: list[float], rows: int = PROBE_ROWS) -> dict:
    """Step seconds at one row and at `rows` rows -> the median one-row step (ms) and what
    each further row adds (us): (median at rows - median at one) / (rows - 1)."""
    one, many = statistics.median(one_row), statistics.median(many_rows)
    return {"one_row_ms": 1e3 * one, "row_us": 1e6 * (many - one) / (rows - 1)}


def summary(probes: list[dict]) -> dict:
    """The probes of one run -> the median of each figure, and their range."""
    return {key: {"median": statistics.median(p[key] for p in probes),
                  "low": min(p[key] for p in probes), "high": max(p[key] for p in probes)}
            for key in ("one_row_ms", "row_us")} if probes else {}


def line(host: dict) -> str:
    """The report's sentence on the host probes of a run (summary's form)."""
    if not host:
        return "Host probe: not run."
    one, row = host["one_row_ms"], host["row_us"]
    return (f"Host probe (this process, the default model's decode step {PROBE_DEPTH} positions "
            f"deep): one row {one['median']:.2f} ms ({one['low']:.2f}-{one['high']:.2f}), each "
            f"further row +{row['median']:.0f} us ({row['low']:.0f}-{row['high']:.0f}); a "
            "verifying step pays the row cost for every draft.")


class HostProbe:
    """The default model loaded in this process, a cache PROBE_DEPTH tokens deep."""

    def __init__(self, threads: int):
        import torch

        from engined.weights import loader
        self.torch = torch
        self.model = loader.load_model("default", threads=threads, progress=False).model
        self.cache = self.model.new_cache(PROBE_DEPTH + PROBE_ROWS)
        with torch.inference_mode():
            self.model.forward(torch.arange(PROBE_DEPTH) % 1000 + 100, self.cache, 0)

    def _step(self, rows: int) -> float:
        tokens = self.torch.arange(rows) + 500
        begin = time.perf_counter()
        self.model.decode_batch(tokens, [self.cache] * rows,
                                list(range(PROBE_DEPTH, PROBE_DEPTH + rows)))
        return time.perf_counter() - begin

    def measure(self, reps: int = PROBE_REPS) -> dict:
        """row_cost of `reps` steps of one row and of PROBE_ROWS rows, taken in turn."""
        one, many = [], []
        with self.torch.inference_mode():
            for rows in (1, PROBE_ROWS):  # warm
                self._step(rows)
            for _ in range(reps):
                one.append(self._step(1))
                many.append(self._step(PROBE_ROWS))
        return row_cost(one, many)
