"""Record a routed-expert trace from a real agent turn (engined/layers/route_trace.py: the
format, the spread to larger shapes and the replay), or show one.

    .venv/bin/python bench/route_trace.py record --out bench/data/route-trace-claude-tool.json.gz
    .venv/bin/python bench/route_trace.py show bench/data/route-trace-claude-tool.json.gz

record: the --request-th request of a live-client capture (../shared/fixtures/live-clients,
copied in tests/fixtures/live-clients; default Claude Code's tool turn), made what kimi-proxy
sends the engine (its dialect -> canonical -> Chat Completions, images as text), rendered by the
engine's chat template and tokenizer of the tiny real-format Kimi-Linear checkpoint the tests
build (tests/support/kimi_tiny.py, seed 0, its context raised to hold the turn); the prompt is
prefilled in --chunk-token chunks, then --new-tokens decoded greedily (end of turn ignored),
each MoE layer's router picks recorded (MoE.route_observer). The file keeps the last --keep
prompt positions and every decoded one, with its provenance. show: the trace's shapes, where
it came from, and its reuse: per layer, how many experts of a position the one before chose
too, and how many distinct experts the positions chose, here and spread to the 48B's shapes.
"""
import argparse
import datetime
import gzip
import json
import os
import pathlib
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engined.layers import route_trace  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "live-clients"
ROUTES = {"/v1/messages": "anthropic", "/v1/chat/completions": "openai_chat"}


def agent_messages(capture: pathlib.Path, request: int) -> dict:
    """The request-th POST of a capture (Anthropic Messages or Chat Completions) -> the Chat
    Completions body kimi-proxy sends upstream for it."""
    from proxy import canonical
    from proxy.clients import policy
    from proxy.dialects import anthropic, openai_chat
    from proxy.upstream.payload import build_payload

    posts = [line for line in map(json.loads, gzip.open(capture)) if line["method"] == "POST"]
    sent = posts[request]
    route = sent["path"].split("?")[0]
    if route not in ROUTES:
        raise SystemExit(f"{capture.name}: request {request} is {route}; record takes "
                         f"{' or '.join(ROUTES)}")
    dialect = {"anthropic": anthropic, "openai_chat": openai_chat}[ROUTES[route]]
    body = sent["body"]
    req = dialect.parse_request(body, policy.resolve({}, ROUTES[route], route,
                                                     dict(sent["headers"]), body))
    req = req.replace(messages=canonical.without_images(req.messages))  # a text-only engine
    return build_payload(req, model="kimi-local", reasoning_field="auto")


def prompt_ids(payload: dict, loaded) -> list[int]:
    """The engine's own rendering of a Chat Completions body (serving/generate.py's order)."""
    from engined.serving import parse as api

    req = api.parse_chat({**payload, "stream": False})
    text = loaded.chat.render(req.messages, req.tools, req.add_generation_prompt,
                              req.tool_choice, req.continue_final)
    return loaded.tokenizer.encode(text)


def moe_layers(model) -> list[int]:
    c = model.config
    return [i for i in range(c.num_hidden_layers) if c.is_moe(i)]


@torch.inference_mode()
def record(model, prompt: list[int], new_tokens: int, chunk: int = 4096):
    """Greedy: `prompt` prefilled in chunks, then new_tokens decoded one at a time ->
    (routes [L, P + N, k] int64, what each MoE layer's router picked at every position; the
    decoded ids)."""
    layers = moe_layers(model)
    picked: dict[int, list[torch.Tensor]] = {i: [] for i in layers}
    for i in layers:
        model.layers[i].block_sparse_moe.route_observer = lambda ids, i=i: picked[i].append(ids.cpu())
    try:
        cache = model.new_cache(len(prompt) + new_tokens)
        for start in range(0, len(prompt), chunk):
            logits = model.forward(torch.tensor(prompt[start:start + chunk]), cache, start)
        decoded = []
        for _ in range(new_tokens):
            decoded.append(int(logits[-1].argmax()))
            logits = model.forward(torch.tensor(decoded[-1:]), cache, len(prompt) + len(decoded) - 1)
    finally:
        for i in layers:
            model.layers[i].block_sparse_moe.route_observer = None
    return torch.stack([torch.cat(picked[i]) for i in layers]), decoded


def record_turn(args) -> route_trace.RouteTrace:
    from engined.weights.kimi_checkpoint import load_kimi_linear
    from tests.support import kimi_tiny

    torch.set_num_threads(args.threads)
    payload = agent_messages(args.capture, args.request)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_kimi_linear(kimi_tiny.write_tiny_checkpoint(
            pathlib.Path(tmp) / "tiny", model_max_length=args.context), progress=False)
        prompt = prompt_ids(payload, loaded)
        routes, decoded = record(loaded.model, prompt, args.new_tokens, args.chunk)
    first = max(0, len(prompt) - args.keep)
    c = loaded.model.config
    info = {"model": {"num_hidden_layers": c.num_hidden_layers, "moe_layers": moe_layers(loaded.model)},
            "positions": {"prompt_tokens": len(prompt), "first_position": first,
                          "decoded_tokens": len(decoded)},
            "source": {"capture": f"tests/fixtures/live-clients/{args.capture.name}",
                       "request": args.request,
                       "rendered": "as kimi-proxy sends it, by the tiny checkpoint's chat template",
                       "checkpoint": "tests/support/kimi_tiny.write_tiny_checkpoint(seed 0, "
                                     f"model_max_length={args.context})",
                       "decode": f"greedy, {len(decoded)} tokens, end of turn ignored",
                       "recorded": datetime.date.today().isoformat(),
                       "command": "bench/route_trace.py record " + " ".join(sys.argv[2:])}}
    return route_trace.RouteTrace(routes[:, first:].contiguous(), c.num_experts, info)


def for_engines(path: pathlib.Path, model: str, num_moe_layers: int) -> dict:
    """KIMI_ROUTE_TRACE=path for every engine started from now on (bench/offload.py), once the
    trace maps onto the synthetic `model` (else ValueError naming both shapes) -> its record."""
    from engined.weights import synthetic

    trace, c = route_trace.load(path), synthetic.config_of(model)
    route_trace.spread(trace, num_moe_layers, c["num_experts"], c["num_experts_per_token"])
    os.environ[route_trace.ENV] = str(path.resolve())
    return {"file": str(path), "shape": trace.describe(), **trace.info}


def reuse(routes: torch.Tensor) -> tuple[float, int]:
    """routes [S, k] -> (mean share of a position's experts the position before chose too,
    distinct experts chosen)."""
    kept = [len(set(a) & set(b)) / len(a) for a, b in zip(routes[1:].tolist(), routes[:-1].tolist())]
    return sum(kept) / max(len(kept), 1), len(torch.unique(routes))


def show(trace: route_trace.RouteTrace) -> list[str]:
    lines = [f"{trace.path}: {trace.describe()}",
             *(f"  {key}: {json.dumps(value)}" for key, value in trace.info.items())]
    from engined.weights import synthetic

    big = synthetic.CONFIGS["kimi-linear-48b"]
    experts, top_k = big["num_experts"], big["num_experts_per_token"]
    spread = route_trace.spread(trace, trace.routes.shape[0], experts, top_k)
    for layer, (here, there) in enumerate(zip(trace.routes, spread)):
        (a, n), (b, m) = reuse(here), reuse(there)
        lines.append(f"  layer {layer}: {100 * a:.0f}% of a position's experts chosen by the one "
                     f"before, {n} distinct; spread to {experts} experts, top-{top_k}: "
                     f"{100 * b:.0f}%, {m} distinct")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record a trace from a live-client capture")
    rec.add_argument("--capture", type=pathlib.Path, default=FIXTURES / "claude-tool.jsonl.gz")
    rec.add_argument("--request", type=int, default=1,
                     help="which POST of the capture, from 0 (default: the tool turn)")
    rec.add_argument("--new-tokens", type=int, default=64)
    rec.add_argument("--keep", type=int, default=2048, help="last prompt positions kept")
    rec.add_argument("--chunk", type=int, default=4096, help="prefill chunk, tokens")
    rec.add_argument("--context", type=int, default=131072, help="the checkpoint's context")
    rec.add_argument("--threads", type=int, default=2)
    rec.add_argument("--out", type=pathlib.Path, required=True)
    see = sub.add_parser("show", help="a trace's shapes, provenance and reuse")
    see.add_argument("trace", type=pathlib.Path)
    args = ap.parse_args(argv)
    if args.command == "record":
        route_trace.save(record_turn(args), args.out)
        args.trace = args.out
    print("\n".join(show(route_trace.load(args.trace))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
