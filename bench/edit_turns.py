"""Speculative decoding on agents' edit turns, served: the engine with --speculative off and on
(two engines, the same model and threads), turn by turn interleaved, greedy, streamed over the
socket. 20 edit turns (rename, type hints, a docstring, a unified diff, on functions of this
repository) and 5 prose turns with nothing to copy: bench/edit_turns.json, sha256-pinned.

Per turn and mode: decode tok/s (tokens after the first over the time from the first token
to the last), and for "on" the request's own drafted and accepted tokens and verifying steps
(vLLM's metrics.speculative_decoding, asked for with "spec_decode_metrics"): the acceptance
rate, and the draft length as drafts per verifying step. llama-server's n-gram row reports
its drafts tested and accepted from its timings. The
tokens of the two modes must be identical on every turn (greedy): a difference fails the run.
Native llama-server (bench/llamacpp_build.sh, the same GGUF and threads) runs the same turns
through its own chat template, plain and with its n-gram speculation as its docs recommend for
rewriting code (--spec-type ngram-simple --spec-draft-n-max 64); --no-llama-server leaves it out.

Before every PROBE_EVERY-th turn and after the last, with the engines idle, bench/host_probe.py
times the default model's decode step in this process at one row and at eight: the host's
memory and compute state, recorded beside the turns (the gain follows the cost of a verified
row, which a neighbour on the VM's cores can more than double while the one-row step holds).

With --context N, each turn's system message opens with the first N tokens of bench/quality.py's
frozen text (this repository's README and code, as an agent's context holds files it read), so
every verifying step reads a cache N tokens deep, as an agent's turns do; recorded apart
(edit_turns_context).

    .venv/bin/python bench/edit_turns.py [--threads 2] [--max-tokens 160] [--reps 1] [--context N]
"""
import argparse
import hashlib
import json
import pathlib
import statistics
import sys
import time

import host_probe
import llamacpp_native
from common import record, unix_post
from served import Engine

from engined.weights.default_model import default_gguf_path

TURNS = pathlib.Path(__file__).resolve().parent / "edit_turns.json"
TURNS_SHA256 = "f731baf603e78bda816bba673e718e8d98d79b8b23d245813808d4d20384a4f7"
LLAMA_SPEC = ("--spec-type", "ngram-simple", "--spec-draft-n-max", "64")
PROBE_EVERY = 5  # turns between host probes (bench/host_probe.py), and one after the last


def frozen_turns(context: int = 0) -> list[dict]:
    """The turns; with context, each system message after `context` tokens of frozen text."""
    data = TURNS.read_bytes()
    if hashlib.sha256(data).hexdigest() != TURNS_SHA256:
        sys.exit(f"{TURNS} changed; the benchmark's numbers need the frozen turns")
    turns = json.loads(data)["turns"]
    if context < 0:
        sys.exit(f"--context {context}: give 0 or more tokens")
    if context:
        preamble = context_text(context)
        for turn in turns:
            messages = turn["messages"]
            if messages[0]["role"] != "system":
                messages.insert(0, {"role": "system", "content": ""})
            messages[0]["content"] = f"Files you have read:\n{preamble}\n\n{messages[0]['content']}"
    return turns


def context_text(tokens: int) -> str:
    """The first `tokens` tokens of bench/quality.py's frozen text (sha256-pinned there)."""
    import quality
    from engined.chat import load_text
    tokenizer, _ = load_text(default_gguf_path())
    ids = tokenizer.encode(quality.frozen_text())
    if len(ids) < tokens:
        sys.exit(f"--context {tokens}: the frozen text has {len(ids)} tokens")
    return tokenizer.decode(ids[:tokens])


def stream_turn(sock: str, messages: list[dict], max_tokens: int) -> tuple[list[int], float, dict]:
    """One greedy streamed chat turn -> (token ids, decode seconds from first to last token,
    the request's own speculative decoding counts: vLLM's metrics.speculative_decoding, on
    the stream's usage chunk)."""
    conn, resp = unix_post(sock, "/v1/chat/completions", {
        "model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True},
        "spec_decode_metrics": True})
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ids, first, last, spec = [], None, None, None
    for raw in resp:
        line = raw.strip()
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            spec = (chunk.get("metrics") or {}).get("speculative_decoding") or spec
            got = (chunk["choices"] or [{}])[0].get("token_ids") or []
            if got:
                last = time.perf_counter()
                first = first or last
                ids += got
    conn.close()
    if spec is None:
        raise RuntimeError("the stream's usage chunk carried no metrics.speculative_decoding")
    return ids, (last - first) if first else 0.0, spec


def run_turn(engine: Engine, turn: dict, max_tokens: int) -> dict:
    ids, seconds, spec = stream_turn(engine.sock, turn["messages"], max_tokens)
    return {"ids": ids, "tok_s": (len(ids) - 1) / seconds if seconds > 0 else 0.0,
            "drafted": spec["num_draft_tokens"], "accepted": spec["num_accepted_draft_tokens"],
            "verify_steps": spec["num_spec_steps"]}


def summarize(rows: list[tuple[dict, dict]]) -> dict:
    """rows: (off, on) per turn -> median tok/s of each, their ratio, acceptance, and the
    draft length: drafts per verifying step (a step with at least one draft)."""
    off = statistics.median(r[0]["tok_s"] for r in rows)
    on = statistics.median(r[1]["tok_s"] for r in rows)
    drafted, accepted = sum(r[1]["drafted"] for r in rows), sum(r[1]["accepted"] for r in rows)
    steps = sum(r[1]["verify_steps"] for r in rows)
    return {"off_tok_s": off, "on_tok_s": on, "ratio": on / off if off else 0.0,
            "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else 0.0, "verify_steps": steps,
            "draft_length": drafted / steps if steps else 0.0}


def llama_server_rows(turns: list[dict], args) -> dict:
    """Median decode tok/s of native llama-server on the same turns, plain and with n-gram
    speculation (its own template and numerics: its tokens are not compared)."""
    bin_dir = llamacpp_native.binaries()
    if bin_dir is None:
        return {}
    rows, configs, drafts = {}, {}, {}
    for name, extra in (("llama-server", ()), ("llama-server ngram-simple", LLAMA_SPEC)):
        speeds: dict[str, list[float]] = {"edit": [], "prose": []}
        tested = {"edit": [0, 0], "prose": [0, 0]}  # drafts tested, accepted (its timings)
        with llamacpp_native.Server(bin_dir, default_gguf_path(), args.threads,
                                    max_context(args), extra) as server:
            for _ in range(args.reps):
                for turn in turns:
                    count, seconds, timings = server.chat_timed(turn["messages"], args.max_tokens)
                    if seconds > 0:
                        speeds[turn["kind"]].append((count - 1) / seconds)
                    tested[turn["kind"]][0] += timings.get("draft_n", 0)
                    tested[turn["kind"]][1] += timings.get("draft_n_accepted", 0)
            configs[name] = server.config
        rows[name] = {kind: statistics.median(v) for kind, v in speeds.items()}
        if extra:
            drafts[name] = {kind: {"drafted": d, "accepted": a} for kind, (d, a) in tested.items()}
        print(f"{name}: {rows[name]} {drafts.get(name, '')}", flush=True)
    return {"version": llamacpp_native.version(bin_dir), "rows": rows, "configs": configs,
            "drafts": drafts}


def max_context(args) -> int:
    return max(4096, args.context + 1024)  # a turn's context, its messages and reply


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--reps", type=int, default=1, help="passes over the turns; medians")
    parser.add_argument("--no-llama-server", action="store_true", help="our engine's rows only")
    parser.add_argument("--context", type=int, default=0, metavar="N",
                        help="tokens of frozen agent context before each turn (default 0)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    turns = frozen_turns(args.context)
    common = dict(model="default", device="cpu", max_context=max_context(args), max_batch=1,
                  threads=args.threads)
    engines = {"off": Engine(**common, extra_args=("--speculative", "off")),
               "on": Engine(**common, extra_args=("--speculative", "on"))}
    by_kind: dict[str, list] = {"edit": [], "prose": []}
    host, probes = host_probe.HostProbe(args.threads), []
    try:
        for _ in range(args.reps):
            for i, turn in enumerate(turns):
                if i % PROBE_EVERY == 0:  # the engines idle: the host's state, turn by turn
                    probes.append(host.measure())
                off = run_turn(engines["off"], turn, args.max_tokens)
                on = run_turn(engines["on"], turn, args.max_tokens)
                if on["ids"] != off["ids"]:
                    sys.exit(f"turn {i}: speculation changed the greedy tokens")
                by_kind[turn["kind"]].append((off, on))
                print(f"turn {i:2d} {turn['kind']:5s} off {off['tok_s']:6.1f} on {on['tok_s']:6.1f} "
                      f"tok/s, accepted {on['accepted']:.0f}/{on['drafted']:.0f}", flush=True)
        probes.append(host.measure())
    finally:
        for engine in engines.values():
            engine.stop()
    summary = {kind: summarize(rows) for kind, rows in by_kind.items()}
    host_state = host_probe.summary(probes)
    llama = {} if args.no_llama_server else llama_server_rows(turns, args)
    lines = ["| turns | off tok/s | on tok/s | on ÷ off | accepted / drafted | drafts a verify step |",
             "|---|---:|---:|---:|---:|---:|"]
    for kind, s in summary.items():
        lines.append(f"| {kind} ({len(by_kind[kind]) // args.reps}) | {s['off_tok_s']:.1f} | "
                     f"{s['on_tok_s']:.1f} | {s['ratio']:.2f}x | {s['accepted']:.0f} / "
                     f"{s['drafted']:.0f} ({100 * s['acceptance']:.0f}%) | "
                     f"{s['draft_length']:.2f} ({s['verify_steps']:.0f} steps) |")
    for name, speeds in llama.get("rows", {}).items():
        tested = llama["drafts"].get(name, {}).get("edit")
        accepted = (f"{tested['accepted']} / {tested['drafted']}"
                    + (f" ({100 * tested['accepted'] / tested['drafted']:.0f}%)" if tested["drafted"] else "")
                    if tested else "")
        lines.append(f"| {name}, edit | {speeds['edit']:.1f} tok/s | prose {speeds['prose']:.1f} "
                     f"tok/s | engine on ÷ this, edit: {summary['edit']['on_tok_s'] / speeds['edit']:.2f}x | "
                     f"{accepted} | |")
    lines += ["", "Greedy tokens identical, speculation on and off, on every turn.",
              host_probe.line(host_state),
              f"llama-server: {llama.get('version', 'not run')}"]
    lines += [f"{name}: {config}" for name, config in llama.get("configs", {}).items()
              if config != "default"]
    print("\n".join(lines))
    if not args.no_record:
        depth = f", {args.context}-token context" if args.context else ""
        record("edit_turns_context" if args.context else "edit_turns",
               {"summary": summary, "llama_server": llama, "context": args.context,
                "host": host_state, "host_probes": probes},
               f"Speculative decoding on edit turns{depth}, SmolLM2-135M-Instruct, "
               f"{args.threads} threads, served",
               " ".join(["python bench/edit_turns.py"] + sys.argv[1:]), lines)


if __name__ == "__main__":
    main()
