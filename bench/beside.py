"""A long prefill with a decode stream beside it (issue 29: "decode of a second stream while
the 32k prefill runs: no step slower than 2x its lone step"). bench/serve_streams.py runs it
after its prefills.

One greedy stream (speculation off: a token a step, so a gap between tokens is a step) decodes
alone for LONE_TOKENS tokens; then a fresh prompt of num_tokens is sent as a non-streamed
request with max_tokens 1; once it has answered the stream runs AFTER_TOKENS more tokens and is
closed. A token's step is its share of the gap before its chunk (a chunk of several tokens,
which the engine sends when its HTTP thread fell behind, spreads its gap over them: with raw
gaps, mostly 0 then, a loaded host divided by zero). The lone step is the median step of the
lone tokens, those that came before the prefill was sent; the slowest step beside the prefill
is the largest step of a token that came after the prefill was sent, up to the first token
after the prefill answered. The stream asks for enough tokens to outlive the prefill at a token per
chunk of MIN_CHUNK (the engine alternates a prefill chunk with a decode step), with
SLACK_TOKENS more for the prefill request's own arrival, and is closed early; the engine
reserves every running sequence's prompt + max_tokens against --max-context: context_room()
is what to add to the prefill's own tokens. A stream that failed or ended before the prefill
answered is reported, and its result says so (outlived_prefill false, or error)."""
import json
import math
import random
import statistics
import threading
import time

from common import unix_post

LONE_TOKENS = 32
AFTER_TOKENS = 8
MIN_CHUNK = 256  # the engine's smallest default prefill chunk (the CPU's)
# steps the stream has to spare while the prefill's request arrives and is admitted: a fresh
# clone's `make test` on a loaded 2-core host (2026-12-07) took more than 32 of the synthetic
# model's steps to admit it, and the stream ended first; a stream closed early costs nothing
SLACK_TOKENS = 256
PROMPT = "Beside the prefill: count on and on."  # a dozen tokens
JOIN_S = 10


def stream_tokens(num_tokens: int) -> int:
    """The stream's max_tokens beside a num_tokens prefill."""
    return LONE_TOKENS + math.ceil(num_tokens / MIN_CHUNK) + AFTER_TOKENS + SLACK_TOKENS


def context_room(num_tokens: int) -> int:
    """Tokens of --max-context the stream reserves beside the prefill (prompt included)."""
    return stream_tokens(num_tokens) + 64


def prefill_beside_decode(sock: str, num_tokens: int, seed: int, timeout: float = 180) -> dict:
    chunks: list[tuple[float, int]] = []  # (arrival, tokens) per chunk of the stream
    lone, done = threading.Event(), threading.Event()
    failure: list[str] = []
    stream: dict = {}

    def decode():
        try:
            conn, resp = unix_post(sock, "/v1/completions", {
                "model": "default", "prompt": PROMPT, "max_tokens": stream_tokens(num_tokens),
                "temperature": 0, "stream": True, "ignore_eos": True, "speculative": False,
                "return_token_ids": True})
            stream["conn"] = conn
            if resp.status != 200:
                failure.append(f"HTTP {resp.status}: {resp.read()[:300]!r}")
                return
            for raw in resp:
                line = raw.strip()
                if line.startswith(b"data: {"):
                    got = json.loads(line[6:])["choices"][0].get("token_ids") or []
                    if got:
                        chunks.append((time.perf_counter(), len(got)))
                    if tokens_in(chunks) > LONE_TOKENS:
                        lone.set()
                if done.is_set():
                    break
        except Exception as exc:  # noqa: BLE001  (a reset, an error event: reported below)
            if not done.is_set():
                failure.append(f"{type(exc).__name__}: {exc}")
        finally:
            if "conn" in stream:
                stream["conn"].close()  # a stream closed early is cancelled by the engine
            lone.set()

    def stop():
        done.set()
        conn = stream.get("conn")
        if conn is not None and conn.sock is not None:
            try:  # wakes a reader blocked on a stalled stream
                conn.sock.shutdown(2)
            except OSError:
                pass
        thread.join(JOIN_S)

    thread = threading.Thread(target=decode, daemon=True)
    thread.start()
    if not lone.wait(timeout) or failure or tokens_in(chunks) <= LONE_TOKENS:
        stop()
        raise RuntimeError(f"the stream beside the prefill did not decode: {failure or chunks}")
    ids = random.Random(seed).choices(range(256), k=num_tokens)
    # encoded before the clock starts: 32k ids take milliseconds of this process's GIL, which
    # the reader thread would count as a gap between the stream's tokens
    request = json.dumps({"model": "default", "prompt": ids, "max_tokens": 1, "temperature": 0})
    sent = time.perf_counter()
    try:
        conn, resp = unix_post(sock, "/v1/completions", request)
        body = json.loads(resp.read())
        conn.close()
    except Exception:
        stop()
        raise
    answered = time.perf_counter()
    if resp.status != 200:
        stop()
        raise RuntimeError(f"prefill of {num_tokens} tokens beside a stream: HTTP {resp.status}: {body}")
    end = time.monotonic() + 30  # AFTER_TOKENS steps
    while thread.is_alive() and time.monotonic() < end:
        if tokens_in(chunks, after=answered) >= AFTER_TOKENS:
            break
        time.sleep(0.01)
    stop()
    row = {"prompt_tokens": body["usage"]["prompt_tokens"], "ttft_s": answered - sent,
           **step_times(list(chunks), sent, answered)}
    return {**row, "error": failure[0]} if failure else row


def tokens_in(chunks: list[tuple[float, int]], after: float = float("-inf")) -> int:
    """The tokens of the chunks (arrival, tokens) that arrived after `after`."""
    return sum(n for t, n in list(chunks) if t > after)


def step_times(chunks: list[tuple[float, int]], sent: float, answered: float) -> dict:
    """The stream's steps from its chunks (arrival, tokens), each token's its share of the gap
    before its chunk (a token a chunk: the gap itself): the lone step, the median of the steps
    of the first LONE_TOKENS tokens that came by `sent`, and the slowest step of a token that
    came after `sent`, up to the first chunk after `answered` (the prefill's reply)."""
    steps = [((b - a) / n, b) for (a, _), (b, n) in zip(chunks, chunks[1:]) for _ in range(n)]
    lone = [step for step, t in steps if t <= sent][:LONE_TOKENS - 1]
    lone_step = statistics.median(lone) if lone else 0.0
    if lone_step <= 0:
        raise RuntimeError("the stream's first tokens came in one chunk: no step time to "
                           "compare the steps beside the prefill with")
    after = next((t for t, _ in chunks if t > answered), None)
    during = [step for step, t in steps if t > sent and (after is None or t <= after)]
    slowest = max(during) if during else answered - sent
    return {"lone_step_s": lone_step, "slowest_step_s": slowest,
            "slowest_x_lone": slowest / lone_step,
            "tokens_during_prefill": sum(n for t, n in chunks if sent < t <= answered),
            "outlived_prefill": after is not None}


def judged(b: dict) -> bool | None:
    """Issue 29's verdict (no gap over 2x the lone step), or None where not measured whole."""
    if "ttft_s" not in b or "error" in b or not b["outlived_prefill"]:
        return None
    return b["slowest_x_lone"] <= 2


def beside_line(b: dict) -> str:
    if "ttft_s" not in b:
        return f"prefill {b['size']} tokens beside a decoding stream: not measured ({b['error']})"
    return (f"prefill {b['size']} tokens beside a decoding stream: TTFT {b['ttft_s']:.3f} s; "
            f"the stream's slowest step {1e3 * b['slowest_step_s']:.1f} ms = "
            f"{b['slowest_x_lone']:.1f}x its lone step ({1e3 * b['lone_step_s']:.1f} ms), "
            f"{b['tokens_during_prefill']} tokens during the prefill"
            + ("" if b["outlived_prefill"] else "; the stream ended before the prefill answered")
            + (f"; stream: {b['error']}" if "error" in b else ""))
