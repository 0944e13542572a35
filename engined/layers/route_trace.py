"""A routed-expert trace: what each MoE layer's router picked, token by token, recorded on one
model (bench/route_trace.py: a real agent turn through the tiny Kimi-Linear checkpoint) and
replayed on another, larger one (bench/offload.py: synthetic:kimi-linear-48b), so that an
expert cache meets a real turn's reuse instead of random routers'.

File (JSON, gzip when the name ends in .gz):
    format     "kimi-local route trace 1"
    model      {"num_experts": E, "top_k": k, "moe_layers": [layer index, ...], ...}
    routes     [L][S][k]: per MoE layer (moe_layers' order), per token position, the k expert
               ids the router chose, in its rank order (position 0 is the trace's first)
    positions  {"prompt_tokens", "first_position", "decoded_tokens"}: which positions of the
               turn these are; source: where the turn and the model came from

Replay: serve with KIMI_ROUTE_TRACE=FILE (read once, at load: serving/daemon.py). The routed
experts of every MoE layer in RAM then follow the trace (`spread` to the model's shapes):
each call's live rows take the next positions of their layer's routes, cycling; the routers
still run, and each trace expert gets the router's weight of the same rank. The ids are
replaced on the host, in the pinned rows the hybrid step reads after its copies out
(layers/moe_offload.py, before the cache lookup and the CPU experts), so the captured graph
segments are unchanged. Layers whose experts stay on the GPU keep their routers: their cost
does not depend on which experts a token picks. Letters: l layer, s position, k choice.
"""
import gzip
import json
import os
import pathlib
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

FORMAT = "kimi-local route trace 1"
ENV = "KIMI_ROUTE_TRACE"


@dataclass(frozen=True)
class RouteTrace:
    routes: torch.Tensor           # [L, S, k] int64
    num_experts: int
    info: dict = field(default_factory=dict)   # the file's model, positions and source
    path: str = ""

    def __post_init__(self):
        r, e = self.routes, self.num_experts
        if r.dim() != 3 or 0 in r.shape:
            raise ValueError(f"route trace {self.path}: routes must be [layers, positions, "
                             f"top_k], got {list(r.shape)}")
        if int(r.min()) < 0 or int(r.max()) >= e:
            raise ValueError(f"route trace {self.path}: expert ids must be 0..{e - 1}, got "
                             f"{int(r.min())}..{int(r.max())}")
        ordered = r.sort(-1).values
        if bool((ordered[..., 1:] == ordered[..., :-1]).any()):
            raise ValueError(f"route trace {self.path}: a position chose one expert twice")

    def describe(self) -> str:
        num_layers, num_positions, top_k = self.routes.shape
        return (f"{num_layers} MoE layers x {self.num_experts} experts, top-{top_k}, "
                f"{num_positions} positions")


def save(trace: RouteTrace, path) -> None:
    num_layers, _, top_k = trace.routes.shape
    model = {**trace.info.get("model", {}), "num_experts": trace.num_experts, "top_k": top_k}
    doc = {"format": FORMAT, **trace.info, "model": model, "routes": trace.routes.tolist()}
    text = json.dumps(doc, separators=(",", ":")) + "\n"
    path = pathlib.Path(path)
    path.write_bytes(gzip.compress(text.encode(), mtime=0) if path.suffix == ".gz" else text.encode())


def load(path) -> RouteTrace:
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"route trace {path}: {exc.strerror}") from None
    try:
        doc = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        if found != FORMAT:
            raise ValueError(f"format {found!r}, not {FORMAT!r}")
        routes = torch.tensor(doc.pop("routes"), dtype=torch.int64)
        num_experts = int(doc["model"]["num_experts"])
    except (ValueError, KeyError, TypeError, OverflowError, EOFError, gzip.BadGzipFile,
            zlib.error) as exc:
        raise ValueError(f"route trace {path}: not a {FORMAT} file ({exc})") from None
    doc.pop("format")
    return RouteTrace(routes, num_experts, doc, str(path))


def from_env(env=os.environ) -> RouteTrace | None:
    """The trace KIMI_ROUTE_TRACE names (bench/offload.py --route-trace), or None."""
    path = env.get(ENV)
    return load(path) if path else None


def spread_token(ids: list[int], from_experts: int, num_experts: int, top_k: int) -> list[int]:
    """One position's trace ids (k of from_experts, rank order) -> top_k distinct ids of
    num_experts. Trace expert e owns the spread e, e + from_experts, e + 2 * from_experts, ...
    (B = num_experts // from_experts ids); choice i gets n_i of them (top_k split over the k
    choices, the first ranks taking the remainder): its first n // 2 are e's own in every
    token (they are reused exactly as e is), the rest depend on the token's other choices
    (reused as that combination is). So a position's ids stay distinct, and the larger
    model's reuse follows the trace's at both grains."""
    k = len(ids)
    per, extra = divmod(top_k, k)
    widest = per + (extra > 0)
    core, wide = widest // 2, widest - widest // 2
    contexts = (num_experts // from_experts - core) // wide
    out = []
    for rank, e in enumerate(ids):
        n = per + (rank < extra)
        others = sorted(x for x in ids if x != e)
        context = sum(x * from_experts ** j for j, x in enumerate(others)) % contexts
        slots = list(range(min(n, core))) + [core + context * wide + j for j in range(n - min(n, core))]
        out += [e + from_experts * s for s in slots]
    return out


def spread(trace: RouteTrace, num_layers: int, num_experts: int, top_k: int) -> torch.Tensor:
    """The trace at another model's shapes -> [num_layers, S, top_k] int64: MoE layer j follows
    the trace's layer j mod L, each position through spread_token. Raises ValueError naming
    both shapes when the model has fewer choices or too few experts per trace expert."""
    _, _, k = trace.routes.shape
    widest = -(-top_k // k)
    if top_k < k or num_experts // trace.num_experts < widest:
        raise ValueError(
            f"route trace {trace.path} ({trace.describe()}) does not map onto this model's "
            f"{num_layers} MoE layers x {num_experts} experts, top-{top_k}: each trace expert "
            f"needs {max(widest, 1)} of its experts and top-{k} or more")
    rows = [[spread_token(ids, trace.num_experts, num_experts, top_k) for ids in layer]
            for layer in trace.routes.tolist()]
    mapped = torch.tensor(rows, dtype=torch.int64)              # [L, S, top_k]
    return mapped[torch.arange(num_layers) % mapped.shape[0]].contiguous()


class RouteFollower:
    """One MoE layer's replay: each call's rows take the next positions, cycling."""

    def __init__(self, routes: torch.Tensor):
        self.routes, self.position = routes, 0                  # [S, k] int64

    def next(self, num_rows: int) -> torch.Tensor:
        """-> [num_rows, k] int64: the experts of the next num_rows positions."""
        start, size = self.position, self.routes.shape[0]
        self.position = (start + num_rows) % size
        if start + num_rows <= size:                            # a decode step: a view
            return self.routes[start:start + num_rows]
        return self.routes[(start + torch.arange(num_rows)) % size]


def follow(model, trace: RouteTrace, offload: frozenset[int]) -> str:
    """The routed experts of a Kimi-Linear model's MoE layers in RAM (`offload`) follow the
    trace from now on -> a line for the log (followers(), attached at once)."""
    line, attach = followers(model, trace, offload)
    attach()
    return line


def followers(model, trace: RouteTrace, offload: frozenset[int]) -> tuple[str, Callable[[], None]]:
    """-> (a line for the log, attach: the MoE layers in RAM follow the trace from its call).
    The spread is made, and a trace that does not fit refused (ValueError), before anything is
    attached: serving/daemon.py attaches after the decode graphs are captured, whose warm-up
    and capture run the step and would take the trace's first positions."""
    if not offload:
        return f"{ENV}: no MoE layer's routed experts are in RAM; the routers choose", lambda: None
    c = model.config
    moe_layers = [i for i in range(c.num_hidden_layers) if c.is_moe(i)]
    routes = spread(trace, len(moe_layers), c.num_experts, c.num_experts_per_token)

    def attach():
        for j, i in enumerate(moe_layers):
            if i in offload:
                model.layers[i].block_sparse_moe.host_experts.follower = RouteFollower(routes[j])

    rest = "" if len(offload) == len(moe_layers) else "; the other layers follow their routers"
    return (f"the routed experts in RAM ({len(offload)} of {len(moe_layers)} MoE layers) follow "
            f"the route trace {trace.path} ({trace.describe()}; spread to {c.num_experts} "
            f"experts, top-{c.num_experts_per_token}){rest}"), attach
