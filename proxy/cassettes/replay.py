"""Cassette replay (protocols.md §10): re-run a recorded exchange and diff it.

    result = replay(cassette)          # {"status", "upstream", "client"} diffs, path-anchored
    replay_paths(paths)                # the `kimi-proxy replay` command

The recorded client body goes through a fresh app whose upstream answers with the
recorded chunks (or JSON). Compared, after normalisation: the status, the upstream
payload (tool-call argument JSON canonicalised, tool-call ids dropped) and the client
bytes (SSE parsed into event/data records, or the JSON body). Normalisation maps ids
to `<id:N>` consistently, zeroes timestamps and replaces signatures by a hash of the
reasoning they carry, so a reasoning change is still a difference. A recorded signature
sealed by another ledger file cannot be read here (`<sig:sealed>`): any signature matches it.
"""
from __future__ import annotations

import difflib
import gzip
import hashlib
import json
import pathlib
import re
import tempfile

from proxy import sse
from proxy.pipeline import chunks_from_json
from proxy.state.signatures import PREFIX as SEALED_PREFIX, read_unverified
from proxy.upstream.client import ListStream

DROP_HEADERS = {"host", "content-length", "authorization", "x-api-key", "accept-encoding"}
ID_RE = re.compile(r"\b(?:msg_|chatcmpl-|chatcmpl_|resp_|rs_|fc_|call_|toolu_|cmpl-)[A-Za-z0-9_\-]+")
SIG_KEYS = {"signature", "encrypted_content", "data"}
SEALED = "<sig:sealed>"
TIME_KEYS = {"created", "created_at", "recorded_at"}


def load(path) -> dict:
    raw = pathlib.Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)


def is_cassette(path) -> bool:
    try:
        data = load(path)
        return isinstance(data, dict) and "k3_cassette" in data
    except (OSError, ValueError):
        return False


class _ReplayUpstream:
    """Answers with the cassette's recorded engine output; keeps the payload it got."""

    url = "replay://cassette"

    def __init__(self, cassette: dict):
        self.cassette = cassette
        self.payloads: list[dict] = []

    def chat(self, payload, headers=None, cancel=None):
        self.payloads.append(payload)
        up = self.cassette["upstream"]
        return up["response"] if up.get("response") else _fold(up["chunks"])

    def open_stream(self, payload, headers=None, cancel=None):
        self.payloads.append(payload)
        up = self.cassette["upstream"]
        return ListStream(up["chunks"] or chunks_from_json(up["response"]))

    def tokenize(self, messages, tools, model):
        return None

    max_model_len = None  # no live server: no context known, no model name asked

    def served_info(self) -> dict:
        """What the recording's upstream card said that shaped the payload (record.served);
        nothing for a cassette older than that field."""
        return dict(self.cassette.get("served") or {})

    def health(self):
        return True, "replay"

    def close(self):
        pass


def _fold(chunks: list) -> dict:
    text, reasoning, calls, finish, usage = [], [], {}, "stop", None
    for ch in chunks:
        usage = ch.get("usage") or usage
        for choice in ch.get("choices") or []:
            d = choice.get("delta") or {}
            text.append(d.get("content") or "")
            reasoning.append(d.get("reasoning_content") or "")
            for tc in d.get("tool_calls") or []:
                call = calls.setdefault(tc.get("index", 0), {"id": "", "type": "function",
                                                             "function": {"name": "", "arguments": ""}})
                call["id"] = tc.get("id") or call["id"]
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    msg = {"role": "assistant", "content": "".join(text), "reasoning_content": "".join(reasoning)}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"id": chunks[0].get("id") if chunks else "x", "model": "x",
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage}


# ---- normalisation ---------------------------------------------------------------------
class Normaliser:
    def __init__(self, decode):
        self.ids: dict[str, str] = {}
        self.decode = decode

    def _id(self, match) -> str:
        return self.ids.setdefault(match.group(0), f"<id:{len(self.ids)}>")

    def __call__(self, value, key: str | None = None):
        if isinstance(value, dict):
            return {k: self(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        if key in TIME_KEYS and isinstance(value, (int, float)):
            return 0
        if key in SIG_KEYS and isinstance(value, str) and value:
            text, ledger_id = self.decode(value)
            if text is None and not ledger_id and value.startswith(SEALED_PREFIX):
                return SEALED
            if text is None:
                return "<sig:ledger-only>" if ledger_id else "<sig:opaque>"
            return f"<sig:{hashlib.sha256(text.encode()).hexdigest()[:16]}>"
        if isinstance(value, str):
            return ID_RE.sub(self._id, value)
        return value


def upstream_view(payload: dict | None) -> dict | None:
    """The upstream payload without tool-call ids, arguments canonicalised."""
    if payload is None:
        return None
    out = json.loads(json.dumps(payload))
    for msg in out.get("messages", []):
        msg.pop("tool_call_id", None)
        for call in msg.get("tool_calls") or []:
            call.pop("id", None)
            fn = call.get("function") or {}
            try:
                fn["arguments"] = json.dumps(json.loads(fn["arguments"]), sort_keys=True)
            except (KeyError, TypeError, ValueError):
                pass
    return out


def sse_records(frames: list[str]) -> list[dict]:
    out = []
    for event, data in sse.parse_frames("".join(frames).encode()):
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = data
        out.append([event, parsed])
    return out


from proxy.cassettes.allowlist import MISSING, UNEXPECTED, _allowed, unexplained  # noqa: F401,E402 - re-exported


def diff(a, b, path: str = "$", out: list | None = None, limit: int = 500) -> list[tuple]:
    """Differences as (path, recorded, replayed); MISSING/UNEXPECTED mark absent sides."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in b:
                out.append((f"{path}.{k}", a[k], MISSING))
            elif k not in a:
                out.append((f"{path}.{k}", UNEXPECTED, b[k]))
            else:
                diff(a[k], b[k], f"{path}.{k}", out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            if i >= len(b):
                out.append((f"{path}[{i}]", a[i], MISSING))
            elif i >= len(a):
                out.append((f"{path}[{i}]", UNEXPECTED, b[i]))
            else:
                diff(a[i], b[i], f"{path}[{i}]", out, limit)
    elif a == SEALED and isinstance(b, str) and b.startswith("<sig:"):
        return out  # sealed under another ledger's secret: nothing to compare it with
    elif a != b or type(a) is not type(b):
        out.append((path, a, b))
    return out


def describe(d: tuple) -> str:
    path, a, b = d
    if b is MISSING:
        return f"{path}: missing in replay"
    if a is UNEXPECTED:
        return f"{path}: unexpected in replay"
    return f"{path}: {a!r:.80} != {b!r:.80}"


# ---- replay ----------------------------------------------------------------------------
def _event_key(record) -> str:
    event, data = record
    if not isinstance(data, dict):
        return f"{event or 'data'}:{data}"
    if event is not None:
        return event
    choices = data.get("choices")
    if choices == []:
        return "chunk:usage"
    if "error" in data:
        return "chunk:error"
    delta = choices[0].get("delta", {}) if choices else {}
    return "chunk:" + "+".join(sorted(delta)) + (":finish" if choices and choices[0].get("finish_reason") else "")


def diff_events(a: list, b: list) -> list[tuple]:
    """Align two event lists by kind, then diff matched events; paths name the event."""
    ka, kb = [_event_key(r) for r in a], [_event_key(r) for r in b]
    out: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes():
        if op == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                diff(a[i][1], b[j][1], f"$[{ka[i]}]", out)
            continue
        out += [(f"$[{ka[i]}]", a[i], MISSING) for i in range(i1, i2)]
        out += [(f"$[{kb[j]}]", UNEXPECTED, b[j]) for j in range(j1, j2)]
    return out


def replay(cassette: dict, config: dict | None = None) -> dict:
    """Run one cassette; returns {"status", "upstream", "client"} lists of differences."""
    from proxy import config as config_mod
    from proxy.app import create_app
    with tempfile.TemporaryDirectory() as tmp:
        recorded = cassette.get("proxy_config") or {"MODEL": "k3", "TOOL_PARSER": "kimi_k3"}  # k3's setup
        cli = {"UPSTREAM": "http://replay.invalid/v1", "LEDGER": f"{tmp}/ledger.sqlite", **recorded,
               **(config or {})}
        app = create_app(config_mod.load(cli, environ={}))
        services = app.extensions["kimi"]
        upstream = services.upstream = _ReplayUpstream(cassette)
        req = cassette["request"]
        headers = {k: v for k, v in req["headers"].items() if k not in DROP_HEADERS and v != "<redacted>"}
        resp = app.test_client().post(req["path"], json=req["body"], headers=headers)
        got_client = resp.get_data(as_text=True)
        decode = _comparing_decoder(services.reasoning.ledger.decode)
        services.close()
    want, got = cassette["client"], {"status": resp.status_code}
    norm_a, norm_b = Normaliser(decode), Normaliser(decode)
    if cassette["streamed"]:
        client = diff_events(norm_a(sse_records(want["sse"])), norm_b(sse_records([got_client])))
    else:
        client = diff(norm_a(want["body"]), norm_b(json.loads(got_client)))
    up_a = norm_a(upstream_view(cassette["upstream"]["request"]))
    up_b = norm_b(upstream_view(upstream.payloads[0] if upstream.payloads else None))
    return {"status": diff(want["status"], got["status"]), "upstream": diff(up_a, up_b), "client": client,
            "docs": {"upstream": (up_a, up_b)}, "preset": resp.headers.get("X-Kimi-Preset") or _preset(req, headers)}


def _comparing_decoder(decode):
    """Read signatures for comparison only: also those another ledger file or the public
    k3 proxy signed (their tag cannot be checked here, and nothing is trusted from them)."""
    return lambda signature: read_unverified(signature, decode)


def _preset(req: dict, headers: dict) -> str:
    from proxy.clients import detect
    return detect.detect(req["path"].split("?")[0], headers, req["body"]).preset.name


def replay_paths(paths, verbose: bool = False, echo=print, allowlist: str | None = None) -> int:
    allow = json.loads(pathlib.Path(allowlist).read_text()) if allowlist else {}
    files = [p for path in paths for p in (sorted(pathlib.Path(path).glob("*.json*"))
                                           if pathlib.Path(path).is_dir() else [pathlib.Path(path)])
             if is_cassette(p)]
    if not files:
        echo("no cassettes found")
        return 1
    num_ok = 0
    for path in files:
        result = replay(load(path))
        diffs = [f"{part}: {describe(d)}" for part, d in unexplained(result, allow.get(path.name.split(".")[0], []))]
        num_ok += not diffs
        echo(f"{'pass' if not diffs else 'FAIL'} {path.name}")
        for d in diffs[: None if verbose else 10]:
            echo(f"    {d}")
    echo(f"{num_ok}/{len(files)} cassettes match")
    return 0 if num_ok == len(files) else 1
