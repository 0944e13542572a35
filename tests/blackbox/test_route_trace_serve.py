"""Black-box: `kimi-engine serve` with KIMI_ROUTE_TRACE (bench/offload.py --route-trace): the
checked-in trace is followed by the MoE layers in RAM of synthetic:small, which still serves;
a trace that does not fit the model stops the start with one line naming both shapes."""
import pytest
import torch

from engined.layers import route_trace
from tests.blackbox.service_helpers import ROOT
from tests.support.engine import Daemon, post

TRACE = ROOT / "bench" / "data" / "route-trace-claude-tool.json.gz"
SERVE = ("--model", "synthetic:small", "--device", "cpu", "--threads", "2", "--max-context", "256")


def test_the_layers_in_ram_follow_the_checked_in_trace_and_serve(tmp_path):
    daemon = Daemon(tmp_path / "cache", *SERVE, "--n-cpu-moe", "2",
                    env={route_trace.ENV: str(TRACE)}).start()
    try:
        reply = post(daemon.sock, "/v1/completions", {"prompt": "hello", "max_tokens": 4})
        assert reply.status == 200, reply.text()
    finally:
        assert daemon.stop() == 0
    assert ("the routed experts in RAM (2 of 7 MoE layers) follow the route trace "
            f"{TRACE} (3 MoE layers x 8 experts, top-2, 2112 positions; spread to 32 experts, "
            "top-4); the other layers follow their routers") in daemon.stderr()


def test_a_trace_that_does_not_fit_stops_the_start(tmp_path):
    routes = torch.arange(3 * 5 * 2).reshape(3, 5, 2) % 64          # 64 experts: over 32
    route_trace.save(route_trace.RouteTrace(routes, 64), tmp_path / "wide.json")
    daemon = Daemon(tmp_path / "cache", *SERVE, "--cpu-moe",
                    env={route_trace.ENV: str(tmp_path / "wide.json")})
    with pytest.raises(RuntimeError, match="exited 1"):
        daemon.start()
    assert (f"kimi-engine: route trace {tmp_path / 'wide.json'} (3 MoE layers x 64 experts, "
            "top-2, 5 positions) does not map onto this model's 7 MoE layers x 32 experts, "
            "top-4") in daemon.stderr()
