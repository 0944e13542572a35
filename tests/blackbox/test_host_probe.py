"""bench/host_probe.py: the host's one-row step and extra-row cost, as bench/edit_turns.py
records them beside its turns."""
import sys

import pytest

from tests.support.bench import BENCH, load


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])
    return load("host_probe")


class FakeClock:
    """perf_counter for the probe: each decode_batch of r rows takes 2 ms + 0.25 ms a row
    past the first, every third 8-row step 1 ms longer still (a busy spell)."""

    def __init__(self):
        self.now, self.steps = 0.0, 0

    def __call__(self) -> float:
        return self.now

    def decode_batch(self, tokens, caches, positions):
        rows = len(positions)
        assert positions == list(range(positions[0], positions[0] + rows))  # one sequence
        self.steps += 1
        self.now += 2e-3 + 0.25e-3 * (rows - 1) + (1e-3 if rows > 1 and self.steps % 6 == 0 else 0)


def test_the_probe_takes_the_medians_of_interleaved_steps(probe, monkeypatch):
    """Five reps of a 1-row then an 8-row step, after one warm pair: the one-row median is
    2 ms; the 8-row steps take 3.75 ms, two of five 4.75 ms: median 3.75 ms, so a row adds
    (3.75 - 2) / 7 ms = 250 us."""
    clock = FakeClock()
    host = probe.HostProbe.__new__(probe.HostProbe)
    host.torch = __import__("torch")
    host.model, host.cache = clock, object()
    monkeypatch.setattr(probe.time, "perf_counter", clock)
    measured = host.measure(reps=5)
    assert clock.steps == 12
    assert measured["one_row_ms"] == pytest.approx(2.0)
    assert measured["row_us"] == pytest.approx(250.0)


def test_a_runs_probes_are_summarized_and_said(probe):
    probes = [{"one_row_ms": 2.3, "row_us": 140.0}, {"one_row_ms": 2.5, "row_us": 390.0},
              {"one_row_ms": 2.2, "row_us": 210.0}]
    host = probe.summary(probes)
    assert host["one_row_ms"] == {"median": 2.3, "low": 2.2, "high": 2.5}
    assert host["row_us"] == {"median": 210.0, "low": 140.0, "high": 390.0}
    said = probe.line(host)
    assert "one row 2.30 ms (2.20-2.50)" in said and "+210 us (140-390)" in said
    assert probe.line(probe.summary([])) == "Host probe: not run."


def test_the_probe_times_the_default_model(probe):
    """The real model, a few reps: a one-row step takes time, and eight rows take longer
    than one (eight rows of W4A8 dot products and attention, whatever the host)."""
    host = probe.HostProbe(threads=1)
    measured = host.measure(reps=3)
    assert 0.05 < measured["one_row_ms"] < 1000
    assert measured["row_us"] > 0
